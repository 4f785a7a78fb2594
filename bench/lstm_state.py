"""How a recurrent agent's LSTM state grows over whole games, from a checkpoint: plays games as
--mode=test does (the env the actors step, the sampled actions) and reports, at some steps of each
game, the size of the LSTM's cell state. A cell that only grows (a unit that adds about the same
each step and forgets nothing) sits where tanh is flat: its output is a constant sign and no
gradient flows back through it. It answers "does my recurrent net use its memory, or count time?".

    .venv/bin/python bench/lstm_state.py bench/results/2core-amd-epyc/pong_runs/resnet_lstm_lr25_seed1 --games 4
    .venv/bin/python bench/lstm_state.py results/memory_run --games 20 --steps 1 5 11 --out state.json
    .venv/bin/python bench/lstm_state.py results/memory_run --untrained   # the same net before training

Per game: its return, its length and, on Atari, its points in order (+ won, - lost); at each of
--steps: the median and the largest |cell| over the units, how many units have |cell| > 3 (tanh
within 0.5 % of +-1) and how many > 100; the share of the gates' inputs (pre-activations) past |5|,
where sigmoid and tanh are within 1 % of their ends and pass almost no gradient; and the length
(L2 norm) of the features the LSTM reads (the torso's, layer-normalised with --lstm_input_norm).
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: the project's packages and experiment.py's flags
    sys.path.insert(0, ROOT)

SATURATED, COUNTING, SWITCH = 3.0, 100.0, 5.0


def cell_figures(cell, gates, features):
    """|cell| of one env's state [units]: median, max, units saturated (> 3) and counting (> 100); the
    share of its gate inputs [4 * units] past |5|; the length of the features its LSTM reads."""
    a = np.abs(np.asarray(cell, np.float64))
    return {"median": float(np.median(a)), "max": float(a.max()), "saturated": int((a > SATURATED).sum()),
            "over_100": int((a > COUNTING).sum()), "units": int(a.size),
            "gates_past_5": float((np.abs(np.asarray(gates)) > SWITCH).mean()),
            "feature_norm": float(np.linalg.norm(np.asarray(features, np.float64)))}


class _Watched:
    """The EvalEnv, keeping the points of the game under way (+ won, - lost) as it steps."""

    def __init__(self, env):
        self.env, self.points = env, []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        result = self.env.step(action)
        if result.reward[0] != 0 and self.env.is_atari:
            self.points.append("+" if result.reward[0] > 0 else "-")
        return result


def play(agent, env, games, steps, stall_frames):
    """Plays `games` whole games as --mode=test does (evaluator.play_episodes, with the run's
    --eval_stall_frames); each game's return, length, points and cell_figures at `steps`."""
    from impala import evaluator
    policy, watched, out, game = evaluator.make_policy(agent, "sample"), _Watched(env), [], {"t": 0, "marks": {}}

    def measured(obs, first, state):
        gates = agent.gate_inputs(obs, first, state) if game["t"] + 1 in steps else None
        action, state = policy(obs, first, state)
        game["t"] += 1
        if gates is not None:
            game["marks"][game["t"]] = cell_figures(state.cell.numpy()[0], gates[0].numpy()[0], gates[1].numpy()[0])
        return action, state

    def on_episode(returns, lengths):
        out.append({"return": returns[-1], "length": lengths[-1], "points": "".join(watched.points),
                    "steps": game["marks"]})
        watched.points, game["t"], game["marks"] = [], 0, {}
    evaluator.play_episodes(measured, agent, watched, games, on_episode=on_episode, stall_frames=stall_frames)
    return out


def restored(run, untrained=False):
    """(agent, EvalEnv, --eval_stall_frames) of a run folder or checkpoint, with the flags its
    options.json saved; `untrained`: the agent those flags build, before any training."""
    import experiment
    from impala import agent as agent_lib
    from impala import evaluator
    from impala import learner as learner_lib
    experiment.FLAGS(["lstm_state.py", "--mode=test", "--load_model_url=" + run])
    flags = experiment.FLAGS
    try:
        experiment.apply_run_options(run)
        agent = learner_lib.untrained_agent(flags)[0] if untrained else learner_lib.restored_agent(flags, run)[0]
    except (experiment.UsageError, learner_lib.CheckpointMismatch) as e:
        raise SystemExit("lstm_state.py: %s" % e)
    if not hasattr(agent.initial_state(1), "cell"):
        raise SystemExit("lstm_state.py: %s's agent %s has no LSTM state; give the run of a recurrent agent "
                         "(ResNetLSTMAgent, MLPLSTMAgent, ...)" % (run, flags.agent_name))
    env = evaluator.EvalEnv(flags.level_name, flags.env_backend, flags.seed + evaluator.TEST_SEED_OFFSET,
                            agent_lib.frame_size_of(flags))
    return agent, env, flags.eval_stall_frames


def table(games):
    lines = ["| game | return | length | step | median abs(cell) | max abs(cell) | units > 3 | units > 100 "
             "| gate inputs past 5 | feature length |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, g in enumerate(games, 1):
        for step, f in sorted(g["steps"].items()):
            lines.append("| %d | %g | %d | %d | %.1f | %.0f | %d of %d | %d | %.0f %% | %.1f |" % (
                i, g["return"], g["length"], step, f["median"], f["max"], f["saturated"], f["units"], f["over_100"],
                100 * f["gates_past_5"], f["feature_norm"]))
    points = ["- game %d: %s" % (i, g["points"]) for i, g in enumerate(games, 1) if g["points"]]
    return lines + (["", "Points in order (+ won, - lost):"] + points if points else [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run", help="a run folder (its newest readable checkpoint) or a checkpoint prefix")
    p.add_argument("--games", type=int, default=4, help="whole games to play")
    p.add_argument("--steps", type=int, nargs="+", default=[10, 100, 500, 1000, 1500, 2000],
                   help="the steps of each game at which the cell state is measured (1 = after the first)")
    p.add_argument("--out", help="also write the games as JSON here")
    p.add_argument("--untrained", action="store_true",
                   help="play the net the run's options build with its first weights instead of the checkpoint's")
    a = p.parse_args(argv)
    if not os.path.exists(a.run) and not os.path.exists(a.run + ".index"):
        raise SystemExit("lstm_state.py: %s does not exist (a run folder or a checkpoint prefix)" % a.run)
    if a.games < 1 or min(a.steps) < 1:
        raise SystemExit("lstm_state.py: --games and --steps take whole numbers from 1")
    agent, env, stall_frames = restored(a.run, a.untrained)
    try:
        games = play(agent, env, a.games, set(a.steps), stall_frames)
    finally:
        env.close()
    print("\n".join(table(games)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(games, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
