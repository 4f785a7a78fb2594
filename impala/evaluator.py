"""Evaluation apart from training: the evaluator worker (--job_name=evaluator) plays greedy episodes
with the newest published weights at intervals, and `play_episodes` plays whole episodes with one
env (`EvalEnv`) for it and for --mode=test."""
import os
import time

import numpy as np
import tensorflow as tf

import envs
import nets
from envs import batch as env_batch
from impala import agent as agent_lib
from impala import precision
from impala import sender as sender_lib
from impala import transport
from impala.stopping import StopSignal
from tools.runlog import RunLog

EVAL_COLUMNS = ("time", "policy_version", "episodes", "mean_return", "std_return", "mean_length")
EVAL_TAGS = {"mean_return": "charts/eval_mean_return", "mean_length": "charts/eval_mean_length"}


class EvalEnv:
    """One env stepped exactly as the training actors step theirs: a 1-env envs.batch of the backend
    --env_backend resolves to for the level (for Atari by default ale-py's native vector env, whose
    new games start with black frames in the stack and press FIRE alone), so a policy is scored on
    the observations it was trained on. training=False: a lost life is no episode boundary; the
    recurrent state and `first` follow whole games. Games follow one another across calls of
    play_episodes, each new one started by the env's own seeded randomness.
    render: render() gives the screen (RGB; for --mode=test's GIF)."""

    def __init__(self, level_name, env_backend, seed, frame_size=envs.FRAME_SIZE, render=False):
        spec = envs.env_spec(level_name, frame_size)
        self.backend = env_batch.resolve_backend(env_backend, level_name)  # 'native' or 'python'
        self.batch = env_batch.make_batch(self.backend, level_name, 1, seed, training=False,
                                          frame_size=frame_size, render=render)
        self.obs = np.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)  # [1, ...]: the observation now
        self.batch.reset(self.obs)

    def step(self, action):
        """Plays one agent step; self.obs becomes the next observation (a new game's first one
        where the game ended). Returns the batch's StepResult (fields of one row)."""
        self.batch.send(np.asarray(action)[None])  # the batch converts it (envs/batch.py)
        return self.batch.recv(self.obs)

    def render(self):
        return self.batch.render()[0]

    def close(self):
        self.batch.close()


def play_episodes(policy, agent, env, n, should_stop=lambda: False, on_episode=None):
    """Plays n whole episodes (games, all lives) with an EvalEnv, from where it stands (a game's
    start, unless a previous call was stopped inside one).
    policy(obs[1, ...], first[1], state) -> (action[1], state). Returns (returns, lengths)."""
    returns, lengths = [], []
    first, state = True, agent.initial_state(1)
    while len(returns) < n and not should_stop():
        action, state = policy(tf.constant(env.obs), tf.constant([first]), state)
        result = env.step(action.numpy()[0])
        first = bool(result.done[0])
        if result.episode_end[0]:
            returns.append(float(result.episode_return[0]))
            lengths.append(int(result.episode_length[0]))
            if on_episode is not None:
                on_episode(returns, lengths)
    return returns, lengths


def greedy_policy(agent):
    """The policy without exploration noise: the argmax of its logits, or a Gaussian's mean."""
    @tf.function
    def greedy(o, f, s):
        out, s = agent(o, f, s)
        return agent.policy.mode(out.policy_logits), s
    return greedy


def run_evaluator(flags, logdir, learner, log=print):
    """The test worker: every --test_every_s it loads the newest published weights
    of `learner` (host:port of learner 0) and plays --test_num_episodes episodes greedily, recording evaluation
    returns apart from the training returns: <logdir>/eval.csv and TensorBoard
    (<logdir>/eval, charts/eval_*). Returns the exit code."""
    stop = StopSignal()
    agent, spec, env_spec = agent_lib.build_from_flags(flags)  # the queue's spec, as actors send
    note = precision.resolve(flags, agent, env_spec, 1, train=False)  # it plays one env
    if note:
        log("evaluator: " + note)
    set_weights = agent_lib.make_weight_setter(nets.published_variables(agent))
    env = EvalEnv(flags.level_name, flags.env_backend, flags.seed + 777, agent_lib.frame_size_of(flags))
    client = transport.ActorClient(learner, spec, flags.queue_capacity, flags.batch_size)
    log("evaluator: %s, %d episodes every %.0f s, learner %s"
        % (flags.level_name, flags.test_num_episodes, flags.test_every_s, learner))
    if not sender_lib.connect(client, flags.actor_reconnect_timeout_s, stop, log):
        env.close()
        return 0 if stop() else 3
    rows = RunLog(os.path.join(logdir, "eval.csv"), EVAL_COLUMNS, os.path.join(logdir, "eval"), EVAL_TAGS)
    rounds = _evaluate_until_stopped(flags, client, agent, set_weights, env, rows, stop, log)
    rows.close()
    env.close()
    client.reset()
    log("evaluator: stopped after %d evaluation rounds" % rounds)
    return 0


def _evaluate_until_stopped(flags, client, agent, set_weights, env, rows, stop, log):
    """Evaluation rounds until a signal or the learner's end; returns how many completed."""
    greedy, rounds = greedy_policy(agent), 0
    while not stop():
        try:
            new = client.fetch_weights_if_new()
        except tf.errors.OpError:
            log("evaluator: learner gone; exiting")
            break
        if new is not None:
            set_weights(tf.constant(new[1]))
        returns, lengths = play_episodes(greedy, agent, env, flags.test_num_episodes, stop)
        if len(returns) == flags.test_num_episodes:
            rounds += 1
            rows.write({"time": time.time(), "policy_version": client.version, "episodes": len(returns),
                        "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
                        "mean_length": float(np.mean(lengths))}, step=client.version)
            log("evaluator: policy version %d: greedy return %.2f +- %.2f over %d episodes"
                % (client.version, np.mean(returns), np.std(returns), len(returns)))
        t_next = time.time() + flags.test_every_s
        while time.time() < t_next and not stop():
            time.sleep(0.2)
    return rounds
