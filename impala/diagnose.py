"""`experiment.py --mode=replay_nonfinite --load_model_url=<run>`: replays the update that
stopped a run on non-finite weights, stage by stage, and names the first stage whose output
is NaN or infinite.

When the learner's weights stop being finite it writes the batch of that update and the
weights it met to <run>/nonfinite_batch_rank<r>.npz (impala/training.py) and stops with exit
code 7. This rebuilds the run's agent with the run's flags (experiment.py restores them from
options.json), loads those weights and walks the update's first half: the normalisers, the
unroll, V-trace's targets, then the losses and gradients of one full-batch step, printing
each stage's range. Returns 0 when every stage is finite (the cause then lies in the later
gradient steps or the optimizer's state, which the file does not hold), 1 when one is not.
"""
import glob
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import nets
from impala import agent as agent_lib
from impala import learner as learner_lib
from impala import loss as loss_lib

TARGET_FIELDS = ("log_rhos", "behaviour_action_log_probs", "target_action_log_probs", "vs", "pg_advantages")


def describe(name, value):
    """Prints one line with the value's shape and range; returns whether it is all finite."""
    a = np.asarray(value, dtype=np.float64)
    finite = np.isfinite(a)
    ok = bool(finite.all())
    shown = a[finite] if finite.any() else np.zeros(1)
    print("  %-34s %-14s %s  min %.4g  max %.4g  max|x| %.4g%s"
          % (name, str(a.shape), "finite " if ok else "NOT FINITE", shown.min(), shown.max(), np.abs(shown).max(),
             "" if ok else "  (%d of %d entries non-finite, first at %s)"
             % (a.size - finite.sum(), a.size, np.argwhere(~finite)[0].tolist())))
    return ok


def load(path):
    """(the update's index, the weights it met, the batch, each normaliser's sample count
    after the update by name, the reward normaliser's mean, var and count by name, empty without
    --normalize_rewards) of a file the learner kept."""
    data = np.load(path)

    def prefixed(prefix):
        return {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
    counts = {k: float(v) for k, v in prefixed("count/").items()}
    return int(data["version"]), data["weights_before"], prefixed("batch/"), counts, prefixed("reward_normaliser/")


def restore_reward_statistics(learner, statistics):
    """--normalize_rewards: the reward normaliser as the kept file has it, after the update (its
    statistics before it were not kept), so the replay folds the batch's returns in once more."""
    if learner.reward_normaliser is not None and statistics:
        for k, v in statistics.items():
            getattr(learner.reward_normaliser, k).assign(v)
        print("  reward_normaliser: the statistics after the update (those before it were not kept)")


def restore_counts(agent, counts, batch):
    """Sets each normaliser's sample count to what it was before the update (its count after
    it less the batch's fresh samples), so that the replay weighs the batch as the run did.
    Files from before the counts were kept replay as a first batch, which replaces the prior."""
    steps, unrolls = batch["action"].shape[:2]
    fresh = float(np.sum(batch["fresh"])) if "fresh" in batch else unrolls
    for norm in nets.normalisers(agent):
        if norm.name in counts:
            norm.count.assign(max(counts[norm.name] - steps * fresh, 1.0))
            print("  %-34s %d samples seen before the update" % (norm.name, int(norm.count.numpy())))
        else:
            print("  (no sample count of %s kept: its statistics replay as from a first batch)" % norm.name)


def statistics_stage(learner, tensors):
    """The batch-start half of the update (Learner._batch_start's stages, described one by
    one); returns (all finite, the batch as its gradient steps read it, value scale)."""
    agent = learner.agent
    ok = True
    learner.move_observation_statistics(tensors)
    tensors = learner.scale_rewards(tensors)
    tensors = learner.bootstrap_at_cuts(tensors)
    if agent.obs_normaliser is not None:
        ok = all([describe("observation normaliser mean", agent.obs_normaliser.mean),
                  describe("observation normaliser var", agent.obs_normaliser.var)])
    if learner.reward_normaliser is not None:
        ok = all([describe("reward normaliser var", learner.reward_normaliser.var),
                  describe("rewards (scaled)", tensors["reward"])]) and ok
    out, _ = agent.unroll(tensors["observation"], tensors["first"], learner._core_state(tensors))
    ok = all([describe("policy parameters", out.policy_logits), describe("baseline (return units)", out.baseline)]) and ok
    tensors, targets = learner.fix_batch_start(tensors, out)
    if targets is None:  # the run did not need them before its steps; shown all the same
        targets = loss_lib.vtrace_targets(out, tensors, learner.flags)
    ok = all([describe("v-trace " + k, getattr(targets, k)) for k in TARGET_FIELDS
              if getattr(targets, k, None) is not None]) and ok
    learner.move_return_statistics(tensors, targets)
    if agent.return_normaliser is not None:
        ok = all([describe("return normaliser mean", agent.return_normaliser.mean),
                  describe("return normaliser var", agent.return_normaliser.var)]) and ok
    return ok, tensors, learner.value_scale()


def replay_file(flags, path):
    """Replays one kept update; returns whether every stage was finite."""
    version, weights, batch, counts, reward_statistics = load(path)
    print("%s: update %d, batch of %d unrolls" % (path, version + 1, batch["action"].shape[1]))
    print("inputs:")
    ok = all([describe(k, v) for k, v in sorted(batch.items()) if v.dtype.kind in "fiu"]
             + [describe("weights_before", weights)])
    # The learner needs a run folder but this replay never checkpoints: a scratch one, kept until the
    # replay ends (the learner holds paths into it) and removed then.
    with tempfile.TemporaryDirectory(prefix="replay_nonfinite_") as scratch:
        learner = learner_lib.Learner(flags, scratch)
        published = nets.published_variables(learner.agent)
        agent_lib.make_weight_setter(published)(tf.constant(weights))
        restore_counts(learner.agent, counts, batch)
        restore_reward_statistics(learner, reward_statistics)
        print("the weights it met, by variable, and the normalisers' counts:")
        ok = all([describe(v.name, v) for v in published]) and ok
        print("the update's stages, in order:")
        finite, tensors, value_scale = statistics_stage(learner, {k: tf.constant(v) for k, v in batch.items()})
        with tf.GradientTape() as tape:
            out, _ = learner.agent.unroll(tensors["observation"], tensors["first"], learner._core_state(tensors))
            loss, stats = loss_lib.compute_losses(out, tensors, flags, value_scale, learner.action_bounds())
        ok = all([finite, describe("total loss (one full-batch step)", loss)]
                 + [describe("  " + k, stats[k]) for k in sorted(stats)]
                 + [describe("gradient global norm",
                             tf.linalg.global_norm(tape.gradient(loss, learner.variables)))]) and ok
        print("every stage is finite: the NaN came from a later gradient step or the optimizer's state" if ok else
              "the first NOT FINITE line above is where the update first went wrong")
    return ok


def replay_nonfinite(flags, run):
    """Every rank's kept update in the run folder `run`; the exit code (0: all finite, 1: not,
    2: nothing to replay)."""
    folder = run if os.path.isdir(run) else os.path.dirname(os.path.dirname(run))
    paths = sorted(glob.glob(os.path.join(folder, "nonfinite_batch_rank*.npz")))
    if not paths:
        print("experiment.py: error: %s holds no nonfinite_batch_rank<r>.npz: the learner writes one only when "
              "a run stops on non-finite weights (exit code 7)" % folder, file=sys.stderr)
        return 2
    return 0 if all([replay_file(flags, p) for p in paths]) else 1
