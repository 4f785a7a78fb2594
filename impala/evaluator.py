"""Evaluation apart from training: the evaluator worker (--job_name=evaluator) plays episodes with the
newest published weights at intervals, and `play_episodes` plays whole episodes with one env
(`EvalEnv`) for it and for --mode=test, with the policy --eval_policy names (`policy_kind`).

Every episode finishes: one that stalls -- no reward and no lost life for --eval_stall_frames -- is
ended there (a new game follows), as is an Atari game at ALE's frame limit; either is said in a
warning line and marked `capped` in the results. A greedy Atari policy stalls so: after a lost life
the native backend presses no FIRE (envs/batch.py), as in training, where the actors' sampled
actions press it; an argmax that never picks FIRE waits for ever."""
import math
import os
import time
from typing import NamedTuple

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
from tools import video as video_lib
from tools.runlog import RunLog

EVAL_COLUMNS = ("time", "policy_version", "episodes", "mean_return", "std_return", "mean_length", "capped")
EVAL_TAGS = {"mean_return": "charts/eval_mean_return", "mean_length": "charts/eval_mean_length"}
POLICIES = ("auto", "sample", "greedy")  # --eval_policy
# --mode=test seeds its env with --seed + this, apart from the actors' seeds; an exported policy
# (policy.json's test_mode_seed) names the same seed so its player can replay those episodes
TEST_SEED_OFFSET = 12345


class EvalEnv:
    """One env stepped exactly as the training actors step theirs: a 1-env envs.batch of the backend
    --env_backend resolves to for the level (for Atari by default ale-py's native vector env, whose
    new games start with black frames in the stack and press FIRE alone), so a policy is scored on
    the observations it was trained on. training=False: a lost life is no episode boundary; the
    recurrent state and `first` follow whole games. After a lost life the Python backend presses
    FIRE as its training envs do (envs.factory.FireAfterLifeLoss); the native one presses nothing,
    in training too. Games follow one another across calls of play_episodes, each new one started
    by the env's own seeded randomness (restart() abandons one).
    render: render() gives the screen (RGB; for --mode=test's GIF and the videos of tools/video.py)."""

    def __init__(self, level_name, env_backend, seed, frame_size=envs.FRAME_SIZE, render=False):
        spec = envs.env_spec(level_name, frame_size)
        self.is_atari = spec.is_atari
        self.frames_per_step = envs.FRAME_SKIP if spec.is_atari else 1  # emulator frames
        self.backend = env_batch.resolve_backend(env_backend, level_name)  # 'native' or 'python'
        self._make = lambda seed: env_batch.make_batch(self.backend, level_name, 1, seed, training=False,
                                                       frame_size=frame_size, render=render)
        self._seed, self._restarts = seed, 0
        self.batch = self._make(seed)
        self.obs = np.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)  # [1, ...]: the observation now
        self.batch.reset(self.obs)

    def restart(self):
        """Abandons the game under way for a new one, from a seed of its own: a reset of the same
        batch would reseed the env and replay its first game."""
        self.batch.close()
        self._restarts += 1
        self.batch = self._make(self._seed + 1000 * self._restarts)
        self.batch.reset(self.obs)

    def lives(self):
        """The game's lives left (0 where a game has none): losing one is progress (play_episodes)."""
        if self.backend == "native":
            return int(self.batch._lives[0])  # NativeAtariBatch follows them from ale-py's info
        ale = getattr(self.batch.envs[0].unwrapped, "ale", None)
        return 0 if ale is None else int(ale.lives())

    def step(self, action):
        """Plays one agent step; self.obs becomes the next observation (a new game's first one
        where the game ended). Returns the batch's StepResult (fields of one row)."""
        self.batch.send(np.asarray(action)[None])  # the batch converts it (envs/batch.py)
        return self.batch.recv(self.obs)

    def render(self):
        return self.batch.render()[0]

    def close(self):
        self.batch.close()


class Episodes(NamedTuple):
    returns: list  # float, each whole episode's (a capped one's so far)
    lengths: list  # int agent steps
    capped: list  # bool: ended by the stall cap or ALE's frame limit, not by the game


class _Game:
    """The game under way: its return and length so far and its agent steps since a nonzero reward or
    a change of lives; stalled() once those reach the cap (never with a cap of 0)."""

    def __init__(self, env, stall_frames):
        self.env, self.cap = env, math.ceil(stall_frames / env.frames_per_step)
        self.start()

    def start(self):
        self.ret, self.length, self.idle, self.lives = 0.0, 0, 0, self.env.lives()

    def stalled(self, result):
        lives = self.env.lives()
        self.ret, self.length = self.ret + float(result.reward[0]), self.length + 1
        self.idle = 0 if result.reward[0] != 0 or lives != self.lives else self.idle + 1
        self.lives = lives
        return 0 < self.cap <= self.idle


def play_episodes(policy, agent, env, n, should_stop=lambda: False, on_episode=None, stall_frames=18000,
                  log=print):
    """Plays n whole episodes (games, all lives) with an EvalEnv, from where it stands (a game's
    start, unless a previous call was stopped inside one), capping stalled ones (module docstring;
    stall_frames: --eval_stall_frames, 0 = no cap). policy(obs[1, ...], first[1], state) ->
    (action[1], state). Returns Episodes; log says each capped one."""
    done, first, state, game = Episodes([], [], []), True, agent.initial_state(1), _Game(env, stall_frames)
    while len(done.returns) < n and not should_stop():
        action, state = policy(tf.constant(env.obs), tf.constant([first]), state)
        result = env.step(action.numpy()[0])
        first = bool(result.new_episode[0])  # the actors' rule (envs/batch.py StepResult)
        stalled = game.stalled(result)
        if result.episode_end[0]:
            cut = env.is_atari and bool(result.cut[0])
            _record(done, float(result.episode_return[0]), int(result.episode_length[0]),
                    "the game reached ALE's frame limit" if cut else None, log)
        elif stalled:
            _record(done, game.ret, game.length, "no reward and no lost life for %d frames (--eval_stall_frames=%d)"
                    % (game.idle * env.frames_per_step, stall_frames), log)
            env.restart()  # a new game
            first = True
        else:
            continue
        game.start()
        if on_episode is not None:
            on_episode(done.returns, done.lengths)
    return done


def _record(done, ret, length, capped_why, log):
    done.returns.append(ret)
    done.lengths.append(length)
    done.capped.append(capped_why is not None)
    if capped_why is not None:
        log("warning: episode %d capped after %d steps, return %.1f so far: %s; it is marked capped in the results"
            % (len(done.returns), length, ret, capped_why))


def policy_kind(choice, level_name):
    """--eval_policy as played: 'sample' (the actions the agent samples, as its actors act) or 'greedy'
    (the argmax of the logits, a Gaussian's mean). auto: sample on Atari, where an argmax can stand
    still for good (see the module docstring), greedy elsewhere, where the evaluation curves of the
    continuous recipes were measured with the mean (rl-baselines3-zoo's enjoy.py chooses so too)."""
    if choice not in POLICIES:
        raise ValueError("--eval_policy=%s: choose one of %s" % (choice, ", ".join(POLICIES)))
    if choice == "auto":
        return "sample" if envs.is_atari(level_name) else "greedy"
    return choice


def make_policy(agent, kind):
    """The tf.function policy(obs, first, state) -> (action, state) of a policy_kind."""
    if kind == "greedy":
        return greedy_policy(agent)

    @tf.function
    def sample(o, f, s):
        out, s = agent(o, f, s)
        return out.action, s
    return sample


def greedy_policy(agent):
    """The policy without exploration noise: the argmax of its logits, or a Gaussian's mean."""
    @tf.function
    def greedy(o, f, s):
        out, s = agent(o, f, s)
        return agent.policy.mode(out.policy_logits), s
    return greedy


def run_evaluator(flags, logdir, learner, log=print):
    """The test worker: every --test_every_s it loads the newest published weights
    of `learner` (host:port of learner 0) and plays --test_num_episodes episodes with --eval_policy, recording
    evaluation returns apart from the training returns: <logdir>/eval.csv (`capped`: the round's capped
    episodes) and TensorBoard (<logdir>/eval, charts/eval_*). Returns the exit code."""
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
    videos = EvalVideos.open(flags, logdir, log) if flags.eval_video_every else None
    rounds = _evaluate_until_stopped(flags, client, agent, set_weights, env, rows, stop, log, videos)
    rows.close()
    env.close()
    if videos is not None:
        videos.close()
    client.reset()
    log("evaluator: stopped after %d evaluation rounds" % rounds)
    return 0


def _evaluate_until_stopped(flags, client, agent, set_weights, env, rows, stop, log, videos=None):
    """Evaluation rounds until a signal or the learner's end; returns how many completed. videos:
    an EvalVideos, which records an episode after the rounds it is due at."""
    kind, rounds = policy_kind(flags.eval_policy, flags.level_name), 0
    policy = make_policy(agent, kind)
    while not stop():
        try:
            new = client.fetch_weights_if_new()
        except tf.errors.OpError:
            log("evaluator: learner gone; exiting")
            break
        if new is not None:
            set_weights(tf.constant(new[1]))
        returns, lengths, capped = play_episodes(policy, agent, env, flags.test_num_episodes, stop,
                                                 stall_frames=flags.eval_stall_frames,
                                                 log=lambda line: log("evaluator: " + line))
        if len(returns) == flags.test_num_episodes:
            rounds += 1
            rows.write({"time": time.time(), "policy_version": client.version, "episodes": len(returns),
                        "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
                        "mean_length": float(np.mean(lengths)), "capped": sum(capped)}, step=client.version)
            log("evaluator: policy version %d: %s return %.2f +- %.2f over %d episodes%s"
                % (client.version, kind, np.mean(returns), np.std(returns), len(returns),
                   " (%d capped)" % sum(capped) if any(capped) else ""))
            if videos is not None and videos.due(rounds):
                videos.record(policy, agent, client.version, stop, flags.eval_stall_frames)
        t_next = time.time() + flags.test_every_s
        while time.time() < t_next and not stop():
            time.sleep(0.2)
    return rounds


def recording(policy, env, show):
    """The policy that first gives show() the screen it acts on (env.render(), RGB): a video's
    frame i is the screen of the episode's step i (tools/video.py)."""
    def recorded(o, f, s):
        show(env.render())
        return policy(o, f, s)
    return recorded


def video_fps(env):
    """An EvalEnv's video frame rate: one screen per agent step at the game's speed."""
    metadata = {} if env.backend == "native" else env.batch.envs[0].metadata
    return video_lib.fps_for(env.is_atari, metadata)


class EvalVideos:
    """--eval_video_every=K: after the first round and every K-th from there, one more episode with
    that round's weights, recorded as <logdir>/videos/eval_v<policy version>.mp4 (a later round at
    the same version replaces it). It is played in an EvalEnv of its own that renders, so the rounds'
    env never does (a rendering native Atari env emulates every game twice) and eval.csv is scored
    as without videos; its games follow one another as the rounds' do."""

    def __init__(self, every, env, folder, log):
        self.every, self.env, self.folder, self.log = every, env, folder, log
        self.video = video_lib.EpisodeVideo(video_fps(env))

    @classmethod
    def open(cls, flags, logdir, log):
        """The recorder, or None after a warning line where the folder or the env's screen fails."""
        folder = os.path.join(logdir, "videos")
        env = None
        try:
            video_lib.prepare_dir(folder)
            env = EvalEnv(flags.level_name, flags.env_backend, flags.seed + 778, agent_lib.frame_size_of(flags),
                          render=True)  # apart from the rounds' env (seed + 777)
            env.render()
        except Exception as e:  # a read-only run folder, MuJoCo without OpenGL on a headless machine
            if env is not None:
                env.close()
            log("evaluator: warning: --eval_video_every=%d: no videos (%s: %s)"
                % (flags.eval_video_every, type(e).__name__, str(e).splitlines()[0][:200]))
            return None
        return cls(flags.eval_video_every, env, folder, log)

    def due(self, rounds):
        return (rounds - 1) % self.every == 0

    def record(self, policy, agent, version, stop, stall_frames):
        """Plays one episode into its video; a stop inside it drops the file."""
        self.video.start(os.path.join(self.folder, "eval_v%08d.mp4" % max(version, 0)))
        try:
            episodes = play_episodes(recording(policy, self.env, self.video.add), agent, self.env, 1, stop,
                                     stall_frames=stall_frames, log=lambda line: self.log("evaluator: video: " + line))
            if episodes.returns:
                self.log("evaluator: policy version %d, a recorded episode: return %.1f, length %d; %s"
                         % (version, episodes.returns[0], episodes.lengths[0], self.video.close().line()))
        finally:
            self.video.abort()

    def close(self):
        self.video.abort()
        self.env.close()
