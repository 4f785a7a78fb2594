"""Evaluation apart from training: the evaluator worker (--job_name=evaluator) plays greedy episodes
with the newest published weights at intervals, and `play_episodes` plays whole episodes with one
env for it and for --mode=test."""
import os
import time

import numpy as np
import tensorflow as tf

import envs
import nets
from impala import agent as agent_lib
from impala import sender as sender_lib
from impala import transport
from impala.stopping import StopSignal
from tools.runlog import RunLog

EVAL_COLUMNS = ("time", "policy_version", "episodes", "mean_return", "std_return", "mean_length")
EVAL_TAGS = {"mean_return": "charts/eval_mean_return", "mean_length": "charts/eval_mean_length"}


def play_episodes(policy, agent, env, n, should_stop=lambda: False, on_episode=None, seed=None):
    """Plays n whole episodes (as info["episode"] reports them) with one env.
    policy(obs[1, ...], first[1], state) -> (action[1], state). Returns (returns, lengths)."""
    returns, lengths = [], []
    obs, _ = env.reset(seed=seed)
    first, state = True, agent.initial_state(1)
    while len(returns) < n and not should_stop():
        action, state = policy(tf.constant(obs[None]), tf.constant([first]), state)
        obs, _, terminated, truncated, info = env.step(int(action.numpy()[0]))
        first = terminated or truncated
        if first:
            obs, _ = env.reset()
        if "episode" in info:
            returns.append(float(np.asarray(info["episode"]["r"])))
            lengths.append(int(np.asarray(info["episode"]["l"])))
            if on_episode is not None:
                on_episode(returns, lengths)
    return returns, lengths


def greedy_policy(agent):
    """The policy without exploration noise: the argmax of its logits."""
    @tf.function
    def greedy(o, f, s):
        out, s = agent(o, f, s)
        return tf.argmax(out.policy_logits, axis=-1, output_type=tf.int32), s
    return greedy


def run_evaluator(flags, logdir, log=print):
    """The test worker: every --test_every_s it loads the newest published weights
    of learner 0 and plays --test_num_episodes episodes greedily, recording evaluation
    returns apart from the training returns: <logdir>/eval.csv and TensorBoard
    (<logdir>/eval, charts/eval_*). Returns the exit code."""
    stop = StopSignal()
    agent, spec, _ = agent_lib.build_from_flags(flags)  # the queue's spec, as actors send
    set_weights = agent_lib.make_weight_setter(nets.published_variables(agent))
    env = envs.make_env(flags.level_name, seed=flags.seed + 777, training=False,
                        frame_size=agent_lib.frame_size_of(flags))
    client = transport.ActorClient(flags.learner_hosts[0], spec, flags.queue_capacity, flags.batch_size)
    log("evaluator: %s, %d episodes every %.0f s, learner %s"
        % (flags.level_name, flags.test_num_episodes, flags.test_every_s, flags.learner_hosts[0]))
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
