"""IMPALA with multi-learner Horovod: the entry point of every worker.

  # a learner (K ranks with mpirun; rank r serves learner_hosts[r])
  python experiment.py --job_name=learner --learner_hosts=127.0.0.1:8001 \
      --actor_hosts=127.0.0.1:8002,127.0.0.1:8003 --level_name=CartPole-v1 --agent_name=MLPAgent
  # actor i (sends to learner_hosts[i % K])
  python experiment.py --job_name=actor --task=0 --learner_hosts=127.0.0.1:8001 ...
  # or the original project's manual launch: each rank names its own server and its own actors
  mpirun -np 1 python experiment.py --job_name=learner --learner_host=localhost:8001 \
      --actor_hosts=localhost:9001,localhost:9003 ... : -np 1 python experiment.py --job_name=learner \
      --learner_host=localhost:8002 --actor_hosts=localhost:9002 ...
  python experiment.py --job_name=actor --learner_host=localhost:8002 --actor_hosts=localhost:9002 --task=0 ...
  # play a trained policy
  python experiment.py --mode=test --load_model_url=results/CartPole-v1_1700000000
  # export it as a SavedModel (results/CartPole-v1_1700000000/exported) and play it without this project
  python experiment.py --mode=export --load_model_url=results/CartPole-v1_1700000000
  python sandbox/play_policy.py results/CartPole-v1_1700000000/exported --episodes=10 --deterministic

Most users start everything with run_experiment_mm_raw.py and a workers CSV.
Flag names follow DeepMind's scalable_agent and the impala_horovod fork.
"""
import json
import os
import re
import sys
import time

from absl import app
from absl import flags
from absl import logging

import nets
from impala import placement
from tools.digits import is_digits, odd_char, strict_number_flags
from tools.files import write_json

# ----------------------------------------------------------------- flags
flags.DEFINE_string("logdir", None, "Run folder (checkpoints, TensorBoard, metrics). "
                    "Default: results/<level_name>_<unix time>; with --mode=train_w_load, the loaded run.")
flags.DEFINE_enum("mode", "train", ["train", "test", "train_w_load", "replay_nonfinite", "export"], "Training, "
                  "testing, training resumed from --load_model_url, replaying the update that stopped that run on "
                  "non-finite weights (docs/training.md#non-finite-updates), or exporting its policy as a "
                  "TensorFlow SavedModel (--export_dir) that sandbox/play_policy.py plays without this project.")
flags.DEFINE_string("load_model_url", None, "A run folder or checkpoint prefix to resume or test.")
flags.DEFINE_string("export_dir", None, "--mode=export: where the SavedModel and its policy.json go "
                    "(default: <run folder>/exported; an earlier export there is replaced).")
flags.DEFINE_bool("export_onnx", True, "--mode=export: also write policy.onnx, the same policy converted by "
                  "tf2onnx (opset 17) for ONNX runtimes such as onnxruntime; where a net has an op tf2onnx cannot "
                  "convert, one line names it and the SavedModel is written alone.")
flags.DEFINE_integer("test_num_episodes", 10, "Episodes played in --mode=test.")
flags.DEFINE_bool("render", False, "--mode=test: also write the episodes as an animated GIF "
                  "(test_episodes.gif in the run folder; every 2nd frame, at most 2000).")
flags.DEFINE_string("video_dir", None, "--mode=test: also write each episode as an MP4 in this folder "
                    "(episode_001.mp4, ...; made if missing, earlier files of the same names replaced): one frame "
                    "per agent step, the screen the policy acted on, so as many frames as the episode's length, "
                    "at the game's speed (15 fps on Atari, the env's render_fps elsewhere; tools/video.py).")
flags.DEFINE_enum("job_name", "learner", ["learner", "actor", "evaluator"],
                  "Which worker this process is. evaluator: the test worker, which plays the "
                  "current policy (--eval_policy) every --test_every_s (eval.csv, TensorBoard eval/).")
flags.DEFINE_float("test_every_s", 60.0, "Seconds between the evaluator's rounds.")
flags.DEFINE_enum("eval_policy", "auto", ["auto", "sample", "greedy"], "How the evaluator and --mode=test act: "
                  "sample (as the actors do) or greedy (the argmax, a Gaussian's mean); auto: sample on Atari, "
                  "where an argmax that never presses FIRE after a lost life stands still, greedy elsewhere.")
flags.DEFINE_integer("eval_stall_frames", 18000, "The evaluator and --mode=test end an episode with no reward and "
                     "no lost life for this many frames (5 minutes of an Atari game), warn, and mark it capped "
                     "in the results; 0: never.")
flags.register_validator("eval_stall_frames", lambda v: v is not None and v >= 0, message="must be >= 0 (0 = off)")
flags.DEFINE_integer("eval_video_every", 0, "The evaluator records one more episode after its first round and "
                     "after every K-th round from there, with the round's weights, as <logdir>/videos/"
                     "eval_v<policy version, 8 digits>.mp4 (eval.csv's policy_version; not scored there). Only that "
                     "episode renders: it is played in an env of its own, the rounds' env never renders. 0: no videos.")
flags.register_validator("eval_video_every", lambda v: v is not None and v >= 0, message="must be >= 0 (0 = off)")
flags.DEFINE_integer("task", 0, "Actor index into --actor_hosts (actors only).")
flags.DEFINE_list("learner_hosts", ["127.0.0.1:8001"], "host:port of each learner rank's server, the same "
                  "list for every worker: rank r serves entry r, actor i feeds entry i mod K.")
flags.DEFINE_string("learner_host", None, "The original project's manual launch (one command line per "
                    "rank, mpirun's MPMD form, see docs/cluster.md): a learner's own server, or the learner "
                    "an actor feeds; --actor_hosts then lists only that learner's actors. With "
                    "--learner_hosts as well, the two must agree.")
flags.DEFINE_list("actor_hosts", [], "host:port of every actor (used to count and assign actors); with "
                  "--learner_host, of this learner's actors only.")
flags.DEFINE_integer("seed", 1, "Random seed.")

flags.DEFINE_string("level_name", "PongNoFrameskip-v4", "Gymnasium environment id: Atari, classic control, "
                    "MuJoCo, an id a module of --env_module registers, or an entry point pkg.module:ClassName.")
flags.DEFINE_list("env_module", [], "Python modules (PKG.MODULE, comma-separated) that every process making "
                  "envs imports before --level_name is looked up, so the ids they register with "
                  "gymnasium.register can be trained; each must be importable on every host (installed, or "
                  "its folder on PYTHONPATH).")
flags.DEFINE_integer("width", 84, "Atari frame width in pixels (84 as in DQN and IMPALA; 42 has a quarter of the pixels).")
flags.DEFINE_integer("height", 84, "Atari frame height in pixels.")
flags.DEFINE_integer("num_action_repeats", 0, "Frames counted per agent step; 0: 4 for Atari "
                     "(its frame skip), 1 otherwise.")
flags.DEFINE_string("agent_name", "SimpleConvNetAgent", "SimpleConvNetAgent (IMPALA's shallow net), "
                    "NatureConvNetAgent (DQN's, as in the published PPO tables; about 3x the arithmetic), "
                    "ResNetAgent, ResNetLSTMAgent, MLPAgent or MLPLSTMAgent (nets/).")
flags.DEFINE_list("mlp_hidden", ["64", "64"], "Widths of the MLP agents' hidden layers (each of the policy's and "
                  "the baseline's torsos); configs/mujoco.flags uses 256,256.")
flags.DEFINE_enum("mlp_activation", "tanh", ["tanh", "relu"], "Nonlinearity of the MLP agents' hidden layers.")
flags.DEFINE_float("lstm_forget_bias", 1.0, "Recurrent agents (ResNetLSTMAgent, MLPLSTMAgent): where the LSTM's "
                   "forget-gate bias starts (it is trained from there), so a new cell keeps sigmoid(b) of itself "
                   "per step: 1 (Sonnet's default, 73 %) or 0 (CleanRL's LSTM PPO, 50 %). Its effect on Pong: "
                   "bench/results/2core-amd-epyc/pong_resnet_lstm.md.")
flags.register_validator("lstm_forget_bias", lambda b: -10.0 <= b <= 10.0,
                         "--lstm_forget_bias: give a number from -10 to 10 (past that the gate's sigmoid is flat "
                         "at 0 or 1), e.g. 1 or 0")
flags.DEFINE_bool("lstm_input_norm", nets.LSTM_INPUT_NORM, "Recurrent agents: layer-normalise the torso's "
                  "features before the LSTM reads them, so that features growing in training cannot turn its gates into switches (as "
                  "they did for ResNetLSTMAgent on Pong with --nolstm_input_norm: bench/results/2core-amd-epyc/"
                  "pong_resnet_lstm_gates.md, bench/results/2core-amd-epyc/pong_resnet_lstm.md). A run whose "
                  "options.json does not name this flag was trained without the norm and is rebuilt without it.")
flags.DEFINE_float("initial_log_std", 0.0, "Continuous actions: where the Gaussian head's log standard deviation "
                   "(one trainable value per action dimension) starts, from --min_log_std to 2; -2 is "
                   "rl-baselines3-zoo's for MuJoCo.")
flags.DEFINE_float("min_log_std", -5.0, "Continuous actions: a floor under that log standard deviation, so that "
                   "the policy keeps exploring and the actors' older actions stay probable under the learner's "
                   "policy; -5 (a std of 0.007) only keeps the arithmetic finite.")


def _log_std_ok(d):
    """The Gaussian's range, as nets/distributions.py checks it (LOG_STD_MIN, LOG_STD_MAX = -5, 2), said at
    parsing: TensorFlow, which that module imports, must wait for --onednn."""
    floor, start = d["min_log_std"], d["initial_log_std"]
    if not -5.0 <= floor < 2.0:
        raise flags.ValidationError("--min_log_std=%g: give a floor from -5 (a std of 0.007) to below 2" % floor)
    if not floor <= start <= 2.0:
        raise flags.ValidationError("--initial_log_std=%g: give a start from the floor --min_log_std=%g to the "
                                    "ceiling 2 (a std of 7.4)" % (start, floor))
    return True


flags.register_multi_flags_validator(["initial_log_std", "min_log_std"], _log_std_ok)

flags.DEFINE_integer("envs_per_actor", 4, "Environments stepped by each actor process, batched "
                     "through the policy.")

flags.DEFINE_enum("env_backend", "auto", ["auto", "native", "python"], "How actors step Atari games: "
                  "native: ale-py's C++ vector env (preprocessing in C++ threads); python: one gymnasium "
                  "env per game, stepped in Python (envs/factory.py); auto: native for Atari, python otherwise "
                  "(classic control, MuJoCo, your own envs).")
flags.DEFINE_integer("env_threads", 1, "C++ threads of each native env group (--env_backend=native).")
flags.DEFINE_integer("env_groups", 0, "Groups the actor's envs are split into: with 2, one group steps "
                     "(native backend, in C++ threads) while the other is in inference. 0 = auto: 2 for the "
                     "native backend (when --envs_per_actor is even), 1 for the Python backend, where "
                     "groups cannot overlap.")
flags.DEFINE_enum("obs_transfer", "auto", ["auto", "stacks", "frames"], "What an unroll carries of its "
                  "stacked Atari frames: stacks (every observation whole) or frames (the first observation's "
                  "stack, then each step's newest frame: 4x fewer bytes to send, queue and replay; the learner "
                  "rebuilds the stacks). auto: frames where actors step the native backend (whose stacks the "
                  "learner can rebuild exactly), stacks otherwise.")
flags.DEFINE_integer("actor_threads", 1, "TensorFlow threads per actor process for inference "
                     "(intra- and inter-op); 0 = TensorFlow's default (all cores).")
flags.DEFINE_integer("learner_threads", 0, "TensorFlow threads of each learner process (intra- and inter-op); "
                     "0 = TensorFlow's default (all cores). 1 leaves cores to actors that share the learner's "
                     "host and are the bottleneck (bench/results/2core-amd-epyc/actor_layout.md); a "
                     "learner-bound run wants the default.")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16", "auto"], "Precision of the agent's torso "
                  "(convs and their FC) in the learner, the actors and the evaluator; variables, optimizer, LSTM, "
                  "heads and losses stay float32. bfloat16 pays on some CPUs and is several times slower on others "
                  "(bench/results/<machine>/compute_dtype.md); auto times both in each process at start-up (a "
                  "gradient step on one minibatch in the learner, an inference step in an actor) and keeps the "
                  "faster, which each process logs.")
flags.DEFINE_bool("normalize_observations", False, "Standardise the observations by running per-element "
                  "mean and variance (Sample Factory's normalize_input, on in its Atari settings), clipped to "
                  "+-5; the learner updates the statistics once per batch and sends them with the weights.")
flags.DEFINE_bool("normalize_returns", False, "Train the baseline head on value targets standardised by their "
                  "running mean and variance (Sample Factory's normalize_returns, on in its Atari settings); "
                  "the agent reports values in return units. The statistics move once per batch and travel "
                  "with the weights.")
flags.DEFINE_bool("normalize_rewards", False, "Divide every reward by the running standard deviation of its "
                  "env's discounted return (--discounting), clipped to +-10: SB3 VecNormalize's norm_reward, "
                  "CleanRL's reward scaling, WALL-E's --norm_reward. For continuous control with "
                  "--reward_clipping=none, usually without --normalize_returns; the learner keeps the "
                  "statistics and saves them with its checkpoints.")
flags.DEFINE_bool("preserve_value_outputs", True, "With --normalize_returns, rescale the baseline head's last "
                  "layer whenever the return statistics move (after the first batch, which sets them) so that "
                  "its values in return units stay as they were (PopArt's preserve-outputs, van Hasselt "
                  "et al. 2016). Without it the value targets, "
                  "bootstrapped from values that move with the statistics, feed back into them and can grow "
                  "without bound (docs/training.md#return-normalisation).")
flags.DEFINE_bool("onednn", True, "TensorFlow's oneDNN CPU kernels (sets TF_ENABLE_ONEDNN_OPTS), "
                  "which TensorFlow turns on by itself only on CPUs with AVX-512 and the like; they speed up "
                  "the conv learner on CPUs without them too (bench/results/2core-amd-epyc/onednn.md).")
flags.DEFINE_integer("total_environment_frames", int(1e9), "Frames to train for.")
flags.DEFINE_integer("batch_size", 32, "Unrolls per learner update (per rank).")
flags.DEFINE_integer("unroll_length", 100, "Agent steps per unroll.")
flags.DEFINE_integer("queue_capacity", 64, "Unrolls the learner's queue holds (>= batch_size).")
flags.DEFINE_integer("prefetch_batches", 1, "Batches the learner dequeues ahead in a background thread "
                     "while the current update trains (scalable_agent staged its batches): the update "
                     "then starts on a ready batch. Without replay the thread also makes the batch's "
                     "tensors; with --replay_parameters mixing in replay it only dequeues, 1 batch ahead. "
                     "0 = dequeue between updates.")
flags.DEFINE_float("entropy_cost", 0.00025, "Entropy cost.")
flags.DEFINE_float("baseline_cost", 0.5, "Baseline cost.")
flags.DEFINE_float("action_bound_cost", 0.0, "Continuous actions: weight of a loss on how far the Gaussian's mean "
                   "lies beyond the action space's bounds (squared, summed like the other terms). Actions are "
                   "clipped to the bounds, so a mean far outside them learns nothing back; configs/pendulum.flags "
                   "uses 1 (bench/results/2core-amd-epyc-without-avx-512/pendulum_bound.md).")
flags.DEFINE_float("discounting", 0.99, "Discount factor.")
flags.DEFINE_enum("reward_clipping", "auto", ["auto", "abs_one", "soft_asymmetric", "none"],
                  "How the loss clips each reward: abs_one clips it to [-1, 1] (IMPALA's protocol, which "
                  "the published Atari scores use); soft_asymmetric squashes it with tanh and weighs "
                  "negative rewards less; none leaves it as the env gave it, as an env whose rewards carry "
                  "their size (MuJoCo's, yours) needs. auto: abs_one for an Atari game, none for every "
                  "other env; decided once at start-up, saved in the run's options.json and said in the "
                  "learner's first lines.")
flags.DEFINE_float("gradients_clipping", 0.0, "Clip gradients by this global norm; 0 = off.")
flags.DEFINE_float("learning_rate", 0.00048, "Learning rate of --optimizer (see --learning_rate_decay).")
flags.DEFINE_enum("learning_rate_decay", "linear", ["linear", "none"], "linear: to 0 at "
                  "--total_environment_frames, as IMPALA; none: constant, as RLlib's APPO.")
flags.DEFINE_enum("optimizer", "rmsprop", ["rmsprop", "adam"], "rmsprop: TF1's RMSProp as the "
                  "original IMPALA used it (mean square starts at 1); adam: Adam with --adam_epsilon.")
flags.DEFINE_float("adam_epsilon", 1e-8, "Adam's epsilon (--optimizer=adam).")
flags.DEFINE_integer("num_sgd_iter", 1, "Gradient steps on each batch: 1 is IMPALA; 2 or more reuse "
                     "the batch (APPO); use with --clip_param.")
flags.DEFINE_integer("num_minibatches", 1, "Gradient steps per pass of --num_sgd_iter, each on "
                     "batch_size / num_minibatches of the batch's unrolls (PPO's minibatches).")
flags.DEFINE_enum("minibatch_over", "unrolls", ["unrolls", "steps"], "What --num_minibatches splits "
                  "a batch into: unrolls: whole unrolls (their steps in order, as a recurrent agent "
                  "needs); steps: single steps drawn from all the batch's unrolls, as PPO shuffles its "
                  "rollout, so that one minibatch is not one stretch of one episode (feedforward agents "
                  "with --vtrace_targets=batch_start only, whose steps do not read their neighbours).")
flags.DEFINE_enum("weight_init", "default", ["default", "orthogonal"], "default: Sonnet's "
                  "(truncated normal, std 1/sqrt(fan_in)); orthogonal: CleanRL's (gain sqrt 2, "
                  "0.01 for the policy logits, 1 for the baseline), set by the learner.")
flags.DEFINE_bool("normalize_advantages", False, "Standardise the policy-gradient advantages of "
                  "each minibatch to mean 0, std 1 (PPO's habit); off in IMPALA.")
flags.DEFINE_float("clip_param", 0.0, "PPO clip of the policy ratio pi/mu in the policy-gradient "
                   "term (APPO); 0: the plain V-trace policy gradient of IMPALA.")
flags.DEFINE_enum("clip_ratio_to", "behaviour", ["behaviour", "batch_start", "fresh_batch_start"],
                  "What --clip_param's ratio compares the policy with: behaviour: the actors' policy mu "
                  "(RLlib's APPO without a target network); batch_start: the learner's policy pi_old when "
                  "the batch arrived (PPO's ratio, 1 at the first step however stale the batch), with "
                  "V-trace correcting mu -> pi_old; fresh_batch_start: batch_start for the queue's unrolls "
                  "and behaviour for replayed ones, whose trust region would otherwise start afresh each "
                  "time they are drawn (docs/replay.md#measured).")
flags.DEFINE_enum("vtrace_targets", "every_step", ["every_step", "batch_start"], "When V-trace's value "
                  "targets and advantages are computed: every_step: in each gradient step from the values "
                  "as they are then (IMPALA); batch_start: once per batch from the values and policy as it "
                  "arrived, fixed for its --num_sgd_iter passes (PPO's returns and advantages), so that "
                  "with reuse the value head fits targets that do not move with it (docs/training.md).")
flags.DEFINE_float("vtrace_lambda", 1.0, "lambda of the V-trace traces c_s = lambda min(1, pi/mu) "
                   "(the paper's Retrace-like remark); 1 is IMPALA's; lower trades variance for "
                   "bias, like GAE's lambda.")
flags.DEFINE_enum("pg_advantage", "vtrace", ["vtrace", "gae"], "The policy gradient's advantage: "
                  "vtrace: the paper's r_s + gamma v_{s+1} - V(x_s); gae: v_s - V(x_s), which with the "
                  "actors on the learner's policy is PPO's GAE(--vtrace_lambda) exactly (the paper's weighs "
                  "every step after the first 1/lambda more).")
flags.DEFINE_float("decay", 0.99, "RMSProp decay.")
flags.DEFINE_float("momentum", 0.0, "RMSProp momentum.")
flags.DEFINE_float("epsilon", 0.1, "RMSProp epsilon, inside the square root as in TF1 and "
                   "Sonnet: step = lr * g / sqrt(ms + epsilon). Where gradients are small, as Atari's are, "
                   "0.1 dominates ms and shrinks the steps; 1e-5 to 1e-4 leaves them to ms.")

flags.DEFINE_string("replay_parameters", '[{"type": "queue", "capacity": 1, "sample_ratio": 1}]',
                    "JSON list of batch sources (queue = live unrolls, standard, custom) with "
                    "capacity and sample_ratio; see docs/replay.md. The default is no replay.")
flags.DEFINE_bool("checkpoint_replay", False, "Also checkpoint what the replay buffers hold (lz4-compressed, "
                  "one file per rank and checkpoint), so a resumed replay run samples from the same buffers; "
                  "without it a resume refills them from live unrolls. Size and time: docs/replay.md.")
flags.DEFINE_float("log_every_s", 10.0, "Seconds between progress lines and TensorBoard points.")
flags.DEFINE_bool("telemetry", True, "Per-worker and per-host figures while the run trains (CPU, memory, rates, "
                  "time shares; TensorBoard workers/ and hosts/, telemetry/ in the run folder; docs/training.md); "
                  "what they cost: bench/results/2core-amd-epyc/telemetry_cost.md.")
flags.DEFINE_float("checkpoint_every_s", 600.0, "Seconds between checkpoints.")
flags.DEFINE_float("actor_timeout_s", 60.0, "A learner that got nothing from its actors for this "
                   "long says so.")
flags.DEFINE_float("exit_when_no_actors_s", 0.0, "Learner exits (code 4) after this long without "
                   "data; 0 = wait forever.")
flags.DEFINE_float("actor_enqueue_backstop_s", 120.0, "How long one enqueue may wait on a full queue before "
                   "it is cancelled and sent again (the learner drops the part it already took). Only a "
                   "backstop: a silent learner is found sooner by small reads.")
flags.register_validator("actor_enqueue_backstop_s", lambda v: v > 0, message="must be > 0")
flags.DEFINE_bool("actor_send_ahead", True, "An actor starts its next unroll while the last one is still on its "
                  "way into the learner's queue. With a full queue (a learner-bound run) that unroll acts on "
                  "weights about two batches older than it would if the actor waited (--noactor_send_ahead): "
                  "the policy lag many passes over each batch feel (configs/hopper.flags; measured in "
                  "bench/results/2core-intel-r-xeon-r-processor/mujoco_impala.md). An actor-bound run wants "
                  "the overlap.")
flags.DEFINE_bool("actor_wait_for_weights", False, "With --noactor_send_ahead: after its unroll is queued an actor "
                  "waits for the learner's next weights before it steps again, so it never acts on weights its "
                  "learner has already updated. With one actor whose unroll fills a batch, every batch is on "
                  "the learner's current policy, as synchronous PPO's (WALL-E's) are; actors and learner then "
                  "take turns. An actor that has waited 30 s (the learner needs more unrolls than the actors "
                  "hold) says so and acts on the weights it has.")
flags.DEFINE_float("actor_reconnect_timeout_s", 120.0, "Actors retry an unreachable learner for "
                   "this long, with backoff, then exit.")

FLAGS = flags.FLAGS
strict_number_flags(FLAGS)  # absl's int() and float() would read --batch_size=３２ as 32

# Flags that describe the run (saved to options.json, restored by train_w_load and --mode=test), every
# flag that changes what the policy sees among them (--env_backend: the two backends reset and stack
# frames differently, envs/batch.py). A flag an older options.json lacks keeps its default, or what
# SAVED_BEFORE_THE_FLAG says such a run used.
RUN_FLAGS = ["env_module", "level_name", "width", "height", "num_action_repeats", "env_backend", "agent_name",
             "mlp_hidden", "mlp_activation", "lstm_forget_bias", "lstm_input_norm", "initial_log_std", "min_log_std",
             "envs_per_actor", "total_environment_frames", "batch_size", "unroll_length", "queue_capacity",
             "entropy_cost", "baseline_cost", "action_bound_cost", "discounting", "reward_clipping",
             "gradients_clipping", "learning_rate", "learning_rate_decay", "decay", "momentum", "epsilon", "seed",
             "replay_parameters",
             "checkpoint_replay", "optimizer", "adam_epsilon", "num_sgd_iter", "num_minibatches", "minibatch_over",
             "clip_param", "clip_ratio_to", "vtrace_lambda", "vtrace_targets", "pg_advantage", "normalize_advantages",
             "weight_init",
             "compute_dtype", "normalize_observations", "normalize_returns", "normalize_rewards",
             "preserve_value_outputs",
             "actor_send_ahead", "actor_wait_for_weights"]

_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-_\[\]:]+:([0-9]{1,5})$")  # \d would take '８００１' too


def _hosts_ok(values):
    return all(_HOSTPORT.match(v) and 0 < int(_HOSTPORT.match(v).group(1)) < 65536 for v in values)


for _name in ("batch_size", "unroll_length", "test_num_episodes", "envs_per_actor",
              "total_environment_frames", "queue_capacity"):
    flags.register_validator(_name, lambda v: v is not None and v >= 1,
                             message="must be a positive integer")
for _name in ("learning_rate", "epsilon", "adam_epsilon"):
    flags.register_validator(_name, lambda v: v > 0, message="must be > 0")
for _name in ("entropy_cost", "baseline_cost", "action_bound_cost", "gradients_clipping", "momentum"):
    flags.register_validator(_name, lambda v: v >= 0, message="must be >= 0")
flags.register_validator("discounting", lambda v: 0 <= v <= 1, message="must be in [0, 1]")
flags.register_validator("decay", lambda v: 0 <= v < 1, message="must be in [0, 1)")
flags.register_validator("task", lambda v: v >= 0, message="must be >= 0")
flags.register_validator("num_sgd_iter", lambda v: v is not None and 1 <= v <= 32,
                         message="must be an integer from 1 to 32")
flags.register_validator("vtrace_lambda", lambda v: 0 < v <= 1, message="must be in (0, 1]")
flags.register_validator("clip_param", lambda v: 0 <= v < 1, message="must be in [0, 1) (0 = off)")
flags.register_validator("actor_threads", lambda v: v >= 0, message="must be >= 0")
flags.register_validator("learner_threads", lambda v: v >= 0, message="must be >= 0")
flags.register_validator("prefetch_batches", lambda v: v is not None and v >= 0,
                         message="must be >= 0 (0 = no prefetching)")
flags.register_validator("env_threads", lambda v: v >= 1, message="must be >= 1")
flags.register_multi_flags_validator(
    ["env_groups", "envs_per_actor"],
    lambda d: d["env_groups"] == 0 or (d["env_groups"] >= 1 and d["envs_per_actor"] % d["env_groups"] == 0),
    message="--env_groups must be 0 (auto) or divide --envs_per_actor (the groups are equal batches)")
flags.register_validator("learner_hosts", lambda v: bool(v) and _hosts_ok(v),
                         message="must be a comma-separated list of host:port (port 1-65535 in ASCII digits)")
flags.register_validator("learner_host", lambda v: v is None or _hosts_ok([v]),
                         message="must be host:port (port 1-65535 in ASCII digits)")
flags.register_validator("actor_hosts", _hosts_ok,
                         message="must be a comma-separated list of host:port (port 1-65535 in ASCII digits)")
flags.register_validator("width", lambda v: 32 <= v <= 256, message="must be from 32 to 256 pixels")
flags.register_validator("height", lambda v: 32 <= v <= 256, message="must be from 32 to 256 pixels")


def _minibatches_ok(d):
    """--num_minibatches splits the batch's unrolls, or with --minibatch_over=steps its steps."""
    if d["minibatch_over"] == "steps":
        items = d["batch_size"] * d["unroll_length"]
        what = "--minibatch_over=steps: --num_minibatches must be >= 1 and divide --batch_size x --unroll_length"
    else:
        items = d["batch_size"]
        what = "--num_minibatches must be >= 1 and divide --batch_size (each minibatch is whole unrolls)"
    if d["num_minibatches"] < 1 or items % d["num_minibatches"]:
        raise flags.ValidationError(what)
    return True


flags.register_multi_flags_validator(["num_minibatches", "batch_size", "unroll_length", "minibatch_over"],
                                     _minibatches_ok)
flags.register_multi_flags_validator(
    ["minibatch_over", "vtrace_targets"],
    lambda d: d["minibatch_over"] == "unrolls" or d["vtrace_targets"] == "batch_start",
    message="--minibatch_over=steps needs --vtrace_targets=batch_start (V-trace's every-step targets read "
            "each step's successors, which a minibatch of single steps does not hold)")
flags.register_multi_flags_validator(
    ["actor_wait_for_weights", "actor_send_ahead"],
    lambda d: not (d["actor_wait_for_weights"] and d["actor_send_ahead"]),
    message="--actor_wait_for_weights needs --noactor_send_ahead (an actor that sends ahead has stepped on before "
            "its unroll is queued)")
flags.register_multi_flags_validator(
    ["queue_capacity", "batch_size"], lambda d: d["queue_capacity"] >= d["batch_size"],
    message="--queue_capacity must be >= --batch_size (the learner dequeues whole batches)")


class UsageError(Exception):
    """Bad input found after flag parsing; main prints it as one line and exits 2."""


def log(msg):
    """One write per line: under PYTHONUNBUFFERED print() writes the text and the
    newline separately, and another MPI rank's line can land between them."""
    sys.stdout.write("%s\n" % (msg,))
    sys.stdout.flush()


# ----------------------------------------------------------------- run folder
def default_logdir():
    return os.path.join("results", "%s_%d" % (FLAGS.level_name.replace("/", "-"), int(time.time())))


def load_saved_options(path):
    """options.json of a run folder (or of the folder holding a checkpoint prefix)."""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    for candidate in (d, os.path.dirname(d)):
        f = os.path.join(candidate, "options.json")
        if os.path.exists(f):
            try:
                with open(f) as fh:
                    return json.load(fh), candidate
            except (OSError, ValueError) as e:
                raise UsageError("%s is not readable JSON (%s)" % (f, e))
    return {}, d


# Run flags whose default changed after runs were saved without them: what such a run used.
SAVED_BEFORE_THE_FLAG = {"lstm_input_norm": False}

# Keys save_options writes besides RUN_FLAGS (said, not restored).
SAVED_EXTRA_KEYS = ("mode", "learner_hosts", "learner_host", "actor_hosts", "argv")


def _saved_type_error(name, value):
    """Why an options.json value cannot be the flag's value (its JSON type or enum), or None."""
    flag = FLAGS[name]
    kind = flag.flag_type()
    if value is None:
        return None if flag.default is None else "must not be null"
    if isinstance(flag.default, bool) or kind == "bool":
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(flag.default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(flag.default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(flag.default, list):
        ok, want = isinstance(value, list) and all(isinstance(v, str) for v in value), 'a list of strings, e.g. ["256", "256"]'
    else:
        ok, want = isinstance(value, str), "a string"
    if not ok:
        return "must be %s, got %s" % (want, json.dumps(value))
    enum = getattr(flag.parser, "enum_values", None)
    if enum and value not in enum:
        return "is %s; choose one of %s" % (json.dumps(value), ", ".join(enum))
    return None


def apply_run_options(src):
    """The flags of the run at `src` (a run folder or checkpoint), from its options.json, under the
    command line's: what --mode=test, export and train_w_load rebuild the checkpoint's agent with."""
    saved, folder = load_saved_options(src)
    where = os.path.join(folder, "options.json")
    apply_saved_options(saved, where)
    if os.path.exists(where):
        lacking = [n for n in ("level_name", "agent_name") if n not in saved and not FLAGS[n].present]
        if lacking:
            raise UsageError('%s has no "%s": the checkpoint cannot be rebuilt without it; add it '
                             '(e.g. "level_name": "CartPole-v1") or pass --%s'
                             % (where, '", "'.join(lacking), lacking[0]))


def apply_saved_options(saved, where="the run's options.json"):
    """Precedence: command line > options saved with the checkpoint > defaults. A value edited by
    hand out of its flag's range, of the wrong JSON type, or a file that is not a JSON object, is
    one line naming the file, as it would be on the command line (assigned values skip the flags'
    validators); an unknown key (a typo, or a flag since removed) is warned of and ignored."""
    if not isinstance(saved, dict):
        raise UsageError('%s must hold a JSON object of flag values, e.g. {"level_name": "CartPole-v1", '
                         '"agent_name": "MLPAgent"}, got a JSON %s' % (where, type(saved).__name__))
    unknown = sorted(k for k in saved if k not in RUN_FLAGS and k not in SAVED_EXTRA_KEYS)
    if unknown:
        print("experiment.py: warning: %s has keys that are not run flags, ignored: %s"
              % (where, ", ".join(map(str, unknown))), file=sys.stderr, flush=True)
    for name in RUN_FLAGS:
        if name in saved and not FLAGS[name].present:
            why = _saved_type_error(name, saved[name])
            if why:
                raise UsageError("%s holds a value its flag refuses: \"%s\" %s (as --%s takes it)"
                                 % (where, name, why, name))
    for name in RUN_FLAGS:
        if name in saved and not FLAGS[name].present:
            FLAGS[name].value = saved[name]
    for name, value in (SAVED_BEFORE_THE_FLAG.items() if saved else ()):
        if name not in saved and not FLAGS[name].present:
            FLAGS[name].value = value
    try:
        FLAGS.validate_all_flags()
    except (flags.Error, TypeError, ValueError) as e:
        raise UsageError("%s holds a value its flag refuses: %s" % (where, str(e).splitlines()[0]))


def save_options(logdir):
    os.makedirs(logdir, exist_ok=True)
    opts = {name: FLAGS[name].value for name in RUN_FLAGS}
    opts.update(mode=FLAGS.mode, learner_hosts=FLAGS.learner_hosts, learner_host=FLAGS.learner_host,
                actor_hosts=FLAGS.actor_hosts,
                argv=sys.argv)
    write_json(os.path.join(logdir, "options.json"), opts, indent=2)


CONV_AGENTS = ("SimpleConvNetAgent", "NatureConvNetAgent", "ResNetAgent", "ResNetLSTMAgent")


def set_onednn():
    """--onednn as TF_ENABLE_ONEDNN_OPTS, which TensorFlow reads when first imported: after this."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if FLAGS.onednn else "0"


def validate_run():
    """Checks that need imports (env ids, agent names) before anything starts."""
    import envs
    try:  # before the id is looked up: the modules register their ids
        envs.import_env_modules(FLAGS.env_module)
    except ImportError as e:
        raise UsageError("--env_module=%s: %s" % (",".join(FLAGS.env_module), e))
    try:
        spec = envs.env_spec(FLAGS.level_name, (FLAGS.width, FLAGS.height))
    except envs.UnknownEnvError as e:
        raise UsageError("--level_name=%s: %s" % (FLAGS.level_name, e))
    if FLAGS.agent_name not in nets.AGENT_NAMES:
        raise UsageError("--agent_name=%s is not an agent; choose one of %s"
                         % (FLAGS.agent_name, ", ".join(nets.AGENT_NAMES)))
    if not FLAGS.mlp_hidden or not all(is_digits(w) and int(w) > 0 for w in FLAGS.mlp_hidden):
        hidden = ",".join(map(str, FLAGS.mlp_hidden))
        raise UsageError("--mlp_hidden=%s: give positive layer widths in ASCII digits separated by commas, "
                         "e.g. 256,256%s" % (hidden, odd_char(hidden)))
    conv = FLAGS.agent_name in CONV_AGENTS
    if conv and len(spec.obs_shape) != 3:
        raise UsageError("--agent_name=%s needs image observations but --level_name=%s gives "
                         "vectors of shape %s; use MLPAgent" % (FLAGS.agent_name, FLAGS.level_name,
                                                               spec.obs_shape))
    if conv:
        try:  # only builds the modules (their variables come on the first call): cheap
            nets.make_agent(FLAGS.agent_name, 2, spec.obs_shape)
        except ValueError as e:
            raise UsageError("--agent_name=%s with --width=%d --height=%d: %s"
                             % (FLAGS.agent_name, FLAGS.width, FLAGS.height, e))
    if not conv and len(spec.obs_shape) != 1:
        raise UsageError("--agent_name=%s needs vector observations but --level_name=%s gives "
                         "shape %s; use SimpleConvNetAgent" % (FLAGS.agent_name, FLAGS.level_name,
                                                              spec.obs_shape))
    if FLAGS.minibatch_over == "steps" and nets.is_recurrent(FLAGS.agent_name):
        raise UsageError("--minibatch_over=steps needs a feedforward agent: --agent_name=%s carries an LSTM "
                         "state along each unroll; use --minibatch_over=unrolls" % FLAGS.agent_name)
    from impala import obs_transfer
    try:
        obs_transfer.sends_frames(FLAGS)  # resolves --env_backend too
    except ValueError as e:
        raise UsageError(str(e))
    from impala import replay
    try:
        specs = replay.parse_replay_parameters(FLAGS.replay_parameters)
    except replay.ReplayConfigError as e:
        raise UsageError(str(e))
    if FLAGS.job_name == "learner":
        warn_replay_trust_region(specs)
    elif FLAGS.job_name == "actor":
        try:
            placement.actor_learner(placement.from_flags(FLAGS), FLAGS.task)
        except placement.PlacementError as e:
            raise UsageError(str(e))


def warn_replay_trust_region(specs):
    """A valid but known-bad pairing, said at each learner rank's start (before Horovod, so every
    rank says it): under batch_start a replayed unroll's trust region starts afresh on every draw,
    and uniform replay collapsed on Atari so."""
    replayed = [i for i, s in enumerate(specs) if s.type != "queue"]
    if FLAGS.clip_param > 0 and FLAGS.clip_ratio_to == "batch_start" and replayed:
        log("warning: --clip_ratio_to=batch_start with replay (--replay_parameters entry %s): the clip's ratio "
            "restarts at 1 each time an unroll is replayed, so reuse can push the policy along the same "
            "advantages again and again; uniform replay collapsed on Atari so (docs/replay.md#measured). "
            "--clip_ratio_to=fresh_batch_start takes replayed steps' ratio against the actors' policy."
            % ", ".join(map(str, replayed)))


def reward_clipping_for(mode, level_name):
    """(--reward_clipping as the loss applies it, why): auto is abs_one for an Atari game (envs.is_atari)
    and none for every other env; any other value stays as given."""
    if mode != "auto":
        return mode, None
    import envs
    if envs.is_atari(level_name):
        return "abs_one", "auto: an Atari game; --reward_clipping=none to turn it off"
    return "none", "auto: not an Atari game; --reward_clipping=abs_one to clip to [-1, 1]"


def resolve_reward_clipping():
    """Sets --reward_clipping=auto to what it means for --level_name, once, in main() before any job
    starts, so that the loss, the evaluator, options.json (a resumed run restores the value saved, an
    old run's abs_one included) and --mode=test all see the mode the run uses. Returns the learner's
    start-up line."""
    mode, why = reward_clipping_for(FLAGS.reward_clipping, FLAGS.level_name)
    if why is None:
        why = ("--reward_clipping=%s" % mode if FLAGS["reward_clipping"].present
               else "as saved in the resumed run's options.json")
    FLAGS["reward_clipping"].value = mode
    return "reward clipping: %s (%s)" % (mode, why)


# ----------------------------------------------------------------- jobs
def learner_rank():
    """(rank, size, local_rank, hvd or None): Horovod's when this learner is one of several ranks."""
    hosts = placement.from_flags(FLAGS)
    if len(hosts.learner_hosts) > 1 or "OMPI_COMM_WORLD_SIZE" in os.environ or "HOROVOD_RANK" in os.environ:
        import horovod.tensorflow as hvd
        hvd.init()
        return hvd.rank(), hvd.size(), hvd.local_rank(), hvd
    return 0, 1, 0, None


def learner_placement(rank, size, hvd):
    """(this rank's server, its actors' ids); every rank checks that no two ranks share a server
    and rank 0 says which rank serves what."""
    hosts = placement.from_flags(FLAGS)
    try:
        address = placement.learner_address(hosts, rank, size)
        actor_ids = placement.learner_actor_ids(hosts, rank, size)
        layout = [(address, len(actor_ids))] if hvd is None else hvd.allgather_object((address, len(actor_ids)))
        placement.check_ranks_agree([a for a, _ in layout])
    except placement.PlacementError as e:
        raise UsageError(str(e))
    if rank == 0 and size > 1:
        log("learners: %s" % ", ".join("rank %d serves %s (%d actor(s))" % (r, a, n) for r, (a, n) in enumerate(layout)))
    return address, actor_ids


def check_a_checkpoint_reads(source):
    """Raises restore's own one-line error unless some checkpoint of --load_model_url reads whole
    (its index and every tensor of its data files): a resumed run writes into the run folder it
    loads, which must not happen when the restore is going to fail."""
    import tensorflow as tf
    from impala import learner as learner_lib
    candidates = learner_lib.checkpoint_candidates(source)
    last = None
    for prefix in candidates:
        try:
            reader = tf.train.load_checkpoint(prefix)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
            return prefix
        except (tf.errors.OpError, ValueError, IndexError, KeyError, OSError) as e:
            last = learner_lib.unreadable_reason(prefix, e)
    raise learner_lib.no_readable_checkpoint(source, candidates, last)


def run_learner(reward_clipping_line=None):
    from impala import devices
    from impala import learner as learner_lib
    from impala import training
    rank, size, local_rank, hvd = learner_rank()
    # before the learner's first TensorFlow op: its threads, and its GPU, if one is visible
    devices.set_threads(FLAGS.learner_threads)
    devices.setup_learner(local_rank, log=log, prefix="[learner %d]" % rank)
    address, actor_ids = learner_placement(rank, size, hvd)
    if rank == 0 and reward_clipping_line:
        log("[learner 0] %s" % reward_clipping_line)
    logdir = FLAGS.logdir
    if FLAGS.mode == "train_w_load" and logdir is None:
        logdir = load_saved_options(FLAGS.load_model_url)[1]
    logdir = logdir or default_logdir()
    if rank == 0:
        if FLAGS.mode == "train_w_load":  # before options.json is rewritten in the folder it resumes
            check_a_checkpoint_reads(FLAGS.load_model_url)
        save_options(logdir)
    try:
        return training.train(FLAGS, logdir, address, len(actor_ids), rank=rank, size=size, log=log,
                              actor_ids=actor_ids)
    except learner_lib.CheckpointMismatch as e:  # --mode=train_w_load's restore
        raise UsageError(str(e))


def run_actor():
    from impala import devices
    devices.hide_gpus_from_actor()  # before the actor's first TensorFlow op
    from impala import actor as actor_lib
    hosts = placement.from_flags(FLAGS)
    code = actor_lib.run(FLAGS, FLAGS.task, placement.actor_learner(hosts, FLAGS.task),
                         placement.actor_seed_index(hosts, FLAGS.task), log=log)
    # A connection attempt abandoned in a helper thread can block interpreter shutdown
    # inside TensorFlow; the actor has nothing left to save, so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_test():
    """Plays --test_num_episodes with the policy of a checkpoint; reports mean/std (test_results.json)
    and, with --render or --video_dir, shows the episodes (a GIF, an MP4 per episode)."""
    import numpy as np
    from impala import agent as agent_lib
    from impala import evaluator
    from impala import learner as learner_lib
    source = FLAGS.load_model_url or FLAGS.logdir
    try:
        agent, spec, prefix = learner_lib.restored_agent(FLAGS, source)
    except learner_lib.CheckpointMismatch as e:
        raise UsageError(str(e))
    # the env the actors step (--env_backend), so the policy sees the observations it was trained on
    env = evaluator.EvalEnv(FLAGS.level_name, FLAGS.env_backend, FLAGS.seed + evaluator.TEST_SEED_OFFSET,
                            agent_lib.frame_size_of(FLAGS), render=FLAGS.render or bool(FLAGS.video_dir))
    frames, videos = [], _test_videos(env)
    kind = evaluator.policy_kind(FLAGS.eval_policy, FLAGS.level_name)
    policy = evaluator.make_policy(agent, kind)
    if FLAGS.render or videos is not None:
        policy = evaluator.recording(policy, env, lambda screen: _show(screen, frames, videos))

    def on_episode(rs, ls):
        log("[test] episode %d/%d: return %.1f, length %d" % (len(rs), FLAGS.test_num_episodes, rs[-1], ls[-1]))
        if videos is not None:
            videos.end()
    start = time.time()
    try:
        returns, lengths, capped = evaluator.play_episodes(
            policy, agent, env, FLAGS.test_num_episodes, stall_frames=FLAGS.eval_stall_frames,
            log=lambda line: log("[test] " + line), on_episode=on_episode)
    finally:  # a Ctrl-C leaves no half-written video
        env.close()
        if videos is not None:
            videos.abort()
    result = {"checkpoint": prefix, "level_name": FLAGS.level_name, "env_backend": env.backend,
              "eval_policy": kind, "episodes": len(returns), "mean_return": float(np.mean(returns)),
              "std_return": float(np.std(returns)), "mean_length": float(np.mean(lengths)), "lengths": lengths,
              "capped_episodes": [i + 1 for i, c in enumerate(capped) if c], "seconds": time.time() - start}
    log("[test] %s: mean return %.2f +- %.2f over %d episodes (checkpoint %s)"
        % (FLAGS.level_name, result["mean_return"], result["std_return"], len(returns), prefix))
    run_dir = source if os.path.isdir(source) else os.path.dirname(os.path.dirname(prefix))
    with open(os.path.join(run_dir, "test_results.json"), "w") as f:
        json.dump(result, f, indent=2)
    if FLAGS.render and frames:
        _write_gif(os.path.join(run_dir, "test_episodes.gif"), frames)
    return 0


def _test_videos(env):
    """Checks that the env shows its screen where --render or --video_dir wants it; returns the
    recorder of --video_dir's MP4s (tools/video.py), or None."""
    if not (FLAGS.render or FLAGS.video_dir):
        return None
    from impala import evaluator
    from tools import video
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        env.render()
    except Exception as e:  # e.g. MuJoCo without an OpenGL context on a headless machine
        raise UsageError("%s: %s cannot render on this machine (%s: %s)"
                         % ("--video_dir" if FLAGS.video_dir else "--render", FLAGS.level_name, type(e).__name__,
                            str(e).splitlines()[0][:200]))
    if not FLAGS.video_dir:
        return None
    return video.EpisodeVideos(FLAGS.video_dir, evaluator.video_fps(env), lambda line: log("[test] " + line))


def _show(screen, gif_frames, videos):
    if FLAGS.render and len(gif_frames) < 4000:
        gif_frames.append(screen)
    if videos is not None:
        videos.add(screen)


def _write_gif(path, frames):
    import imageio
    imageio.mimsave(path, [fr for fr in frames[::2] if fr is not None], duration=1 / 30, loop=0)
    log("[test] wrote %s (%d frames)" % (path, len(frames[::2])))


def _prepare_video_dir():
    """--video_dir's folder, made and checked before anything else starts."""
    from tools import video
    try:
        video.prepare_dir(FLAGS.video_dir)
    except video.VideoDirError as e:
        raise UsageError("--video_dir=%s: %s" % (FLAGS.video_dir, e))


def run_export():
    """--mode=export: the checkpoint of --load_model_url as a SavedModel at --export_dir."""
    from impala import export
    from impala import learner as learner_lib
    source = FLAGS.load_model_url
    export_dir = FLAGS.export_dir or os.path.join(load_saved_options(source)[1], "exported")
    try:
        export.export_run(FLAGS, source, export_dir, log=log)
    except (learner_lib.CheckpointMismatch, FileExistsError) as e:
        raise UsageError(str(e))
    return 0


def main(argv):
    if len(argv) > 1:
        raise app.UsageError("unexpected arguments: %s (flags look like --name=value)" % " ".join(argv[1:]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.set_verbosity(logging.WARNING)  # keep TF's Python INFO lines out of the progress output
    try:
        if FLAGS.mode == "test" and FLAGS.video_dir:
            _prepare_video_dir()
        if FLAGS.mode in ("test", "train_w_load", "replay_nonfinite", "export"):
            if not FLAGS.load_model_url and not (FLAGS.mode == "test" and FLAGS.logdir):
                raise UsageError("--mode=%s needs --load_model_url=<run folder or checkpoint>" % FLAGS.mode)
            src = FLAGS.load_model_url or FLAGS.logdir
            if not os.path.exists(src) and not os.path.exists(src + ".index"):
                raise UsageError("--load_model_url=%s does not exist" % src)
            apply_run_options(src)
        set_onednn()
        validate_run()
        reward_clipping_line = resolve_reward_clipping()
        if FLAGS.mode == "test":
            return run_test()
        if FLAGS.mode == "export":
            return run_export()
        if FLAGS.mode == "replay_nonfinite":
            from impala import diagnose
            return diagnose.replay_nonfinite(FLAGS, FLAGS.load_model_url)
        if FLAGS.job_name == "actor":
            return run_actor()
        if FLAGS.job_name == "evaluator":
            from impala import evaluator
            return evaluator.run_evaluator(FLAGS, FLAGS.logdir or default_logdir(),
                                           placement.evaluator_learner(placement.from_flags(FLAGS)), log=log)
        return run_learner(reward_clipping_line)
    except (UsageError, FileNotFoundError) as e:
        print("experiment.py: error: %s" % e, file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
