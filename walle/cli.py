"""WALL-E's PPO command line: the flags, their checks and main(), shared by ppo_main.py (-n 1)
and ppo_parallel_main.py (-n N).

This module imports no TensorFlow: main() parses and checks the flags first and loads the
agent and its training loop (training.py, agent.py) only then, so --help and a bad flag answer
at once, and the sampler processes, which re-import the entry script, stay TensorFlow-free.
"""
import argparse
import sys

import envs
from tools.digits import float_arg, int_arg
from walle import config
from walle import samplers as samplers_lib
from walle.config import parse_hidden

HALFCHEETAH_RESULTS = "bench/results/ppo_halfcheetah.md"  # the zoo recipe's HalfCheetah runs


def add_arguments(parser, default_batch_size, default_num_samplers):
    """All the flags, in three groups: the run, the update, the nets."""
    parser.add_argument("env_name", nargs="?", help="gymnasium id of a continuous-action env, e.g. "
                        "HalfCheetah-v5 (with --mode=train_w_load or test: the saved run's)")
    _add_run_arguments(parser.add_argument_group("run"), default_batch_size, default_num_samplers)
    _add_checkpoint_arguments(parser.add_argument_group("checkpoints and resume"))
    _add_update_arguments(parser.add_argument_group("update"))
    _add_net_arguments(parser.add_argument_group("nets"))
    return parser


def _add_run_arguments(group, default_batch_size, default_num_samplers):
    group.add_argument("-it", "--iterations", type=int_arg, default=1000, help="training iterations")
    group.add_argument("-b", "--batch_size", type=int_arg, default=default_batch_size,
                       help="env steps collected per iteration, over all samplers together")
    group.add_argument("-n", "--num_samplers", type=int_arg, default=default_num_samplers,
                       help="1: the agent collects itself; N >= 2: N sampler processes")
    group.add_argument("--max_steps", type=int_arg, default=0,
                       help="collect at most this many env steps in all (0: no limit)")
    group.add_argument("--seed", type=int_arg, default=0, help="sampler k uses seed + k")
    group.add_argument("--logdir", default="", help="run folder (default results/ppo_<env>_<unix time>)")
    group.add_argument("--sampler_timeout", type=float_arg, default=600.0,
                       help="seconds without a message before a live sampler counts as stuck")
    group.add_argument("--quiet", action="store_true", help="no per-iteration console line")
    group.add_argument("--eval_episodes", type=int_arg, default=0,
                       help="after training, this many episodes with the policy's mean action "
                            "(no noise), written to <logdir>/eval.json (0: none)")


def _add_checkpoint_arguments(group):
    group.add_argument("--mode", choices=("train", "train_w_load", "test", "export"), default="train",
                       help="train: a new run; train_w_load: continue the run --load_model_url names (its "
                            "flags, then the ones given here; --iterations and --max_steps count the whole "
                            "run); test: --eval_episodes (10 if 0) with its policy -> test_results.json; "
                            "export: its policy as a TensorFlow SavedModel (--export_dir) that "
                            "sandbox/play_policy.py plays without this project")
    group.add_argument("--load_model_url", default="",
                       help="a run folder (its newest checkpoint) or <run>/checkpoints/ckpt-N")
    group.add_argument("--export_dir", default="",
                       help="--mode=export: where the SavedModel, its policy.json and policy.onnx go (empty: "
                            "<run folder>/exported; an earlier export there is replaced)")
    group.add_argument("--export_onnx", action=argparse.BooleanOptionalAction, default=True,
                       help="--mode=export: also write policy.onnx, the same policy converted by tf2onnx "
                            "(opset 17) for ONNX runtimes such as onnxruntime; --no-export_onnx: the "
                            "SavedModel alone")
    group.add_argument("--checkpoint_every_s", type=float_arg, default=600.0,
                       help="seconds between checkpoints (0: only at the end, at Ctrl-C and when a sampler "
                            "fails; those always)")


def _add_update_arguments(group):
    group.add_argument("-g", "--gamma", type=float_arg, default=0.995)
    group.add_argument("-l", "--lam", type=float_arg, default=0.98, help="GAE lambda")
    group.add_argument("--loss", choices=("kl", "clip"), default="kl",
                       help="kl: WALL-E's adaptive KL penalty + hinge; clip: clipped surrogate")
    group.add_argument("-k", "--kl_targ", type=float_arg, default=0.003, help="KL target (--loss kl)")
    group.add_argument("--policy_epochs", type=int_arg, default=20, help="full-batch steps at most (--loss kl)")
    group.add_argument("--clip", type=float_arg, default=0.2, help="ratio clip epsilon (--loss clip)")
    group.add_argument("--clip_epochs", type=int_arg, default=10, help="passes over the batch (--loss clip)")
    group.add_argument("--clip_minibatch", type=int_arg, default=64, help="minibatch size (--loss clip)")
    group.add_argument("--target_kl", type=float_arg, default=0.0,
                       help="stop passes above this KL (--loss clip; 0: off)")
    group.add_argument("--ent_coef", type=float_arg, default=0.0, help="entropy bonus (--loss clip)")
    group.add_argument("--max_grad_norm", type=float_arg, default=0.5, help="gradient clipping (--loss clip)")
    group.add_argument("--policy_lr", type=float_arg, default=0.0,
                       help="0: 9e-4 / sqrt(hid2) for --loss kl, 3e-4 for --loss clip")
    group.add_argument("--lr_decay", choices=("none", "linear"), default="none",
                       help="none: the policy's rate stays; linear: it falls to 0 at --max_steps, as CleanRL's "
                            "PPO anneals it (needs --max_steps)")
    group.add_argument("--value_lr", type=float_arg, default=0.0, help="0: 1e-2 / sqrt(value hid2)")
    group.add_argument("--value_epochs", type=int_arg, default=10)
    group.add_argument("--norm_reward", action="store_true",
                       help="rewards / running std of the discounted return, clipped as SB3's VecNormalize "
                            "clips them, instead of rewards * (1 - gamma)")
    group.add_argument("--value_fit", choices=("separate", "joint"), default="separate",
                       help="separate: --value_epochs of regression after the policy update; joint (--loss clip): "
                            "SB3's update, one Adam on policy + vf_coef * value loss, per-minibatch advantages "
                            f"(rl-zoo's HalfCheetah recipe uses it: {HALFCHEETAH_RESULTS})")
    group.add_argument("--vf_coef", type=float_arg, default=0.5, help="value loss weight (--value_fit joint)")
    group.add_argument("--adam_eps", type=float_arg, default=1e-8, help="epsilon of every Adam (SB3 uses 1e-5)")


def _add_net_arguments(group):
    group.add_argument("--hid_mult", type=int_arg, default=10, help="hidden width multiplier")
    group.add_argument("--init_logvar", type=float_arg, default=-1.0,
                       help="initial policy log-variance (WALL-E's nets)")
    group.add_argument("--hidden", default="", help="hidden widths of both nets, e.g. 256,256: SB3's MlpPolicy "
                       "(torch-default init, --log_std_init); empty: WALL-E's widths from --hid_mult")
    group.add_argument("--activation", choices=("tanh", "relu"), default="tanh", help="hidden nonlinearity")
    group.add_argument("--log_std_init", type=float_arg, default=None,
                       help="initial policy log-std, a plain variable (--hidden only; unset: 0.0)")
    group.add_argument("--obs_clip", type=float_arg, default=samplers_lib.OBS_CLIP,
                       help="normalised observations are clipped to +-this")


def check_arguments(parser, args):
    """One clear error per bad flag (argparse exits with status 2); returns the env's spec."""
    positive = ["iterations", "batch_size", "num_samplers", "policy_epochs", "clip_epochs",
                "clip_minibatch", "value_epochs", "hid_mult"]
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("gamma", "lam"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    for name in ("kl_targ", "clip", "max_grad_norm", "sampler_timeout", "obs_clip", "vf_coef", "adam_eps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    for name in ("max_steps", "target_kl", "ent_coef", "policy_lr", "value_lr", "eval_episodes",
                 "checkpoint_every_s"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    _check_net_and_update(parser, args)
    if args.lr_decay == "linear" and not args.max_steps:
        parser.error("--lr_decay linear needs --max_steps: the rate falls to 0 at that many steps")
    if 0 < args.max_steps < args.batch_size:
        parser.error(f"--max_steps ({args.max_steps}) must be 0 (no limit) or >= -b/--batch_size ({args.batch_size})")
    if args.batch_size < args.num_samplers:
        parser.error(f"-b/--batch_size ({args.batch_size}) must be >= -n/--num_samplers "
                     f"({args.num_samplers}): every sampler needs at least one step")
    return _check_env(parser, args.env_name)


def _check_net_and_update(parser, args):
    """The flags that only work together: --hidden with --log_std_init, --value_fit joint with --loss clip."""
    try:
        hidden = parse_hidden(args.hidden)
    except ValueError as e:
        parser.error(str(e))
    if hidden is None and args.log_std_init is not None:
        parser.error("--log_std_init needs --hidden (WALL-E's nets take --init_logvar)")
    if args.value_fit == "joint" and args.loss != "clip":
        parser.error(f"--value_fit joint needs --loss clip, got --loss {args.loss}")
    if args.value_fit == "joint" and args.clip_minibatch < 2:
        parser.error(f"--value_fit joint normalises advantages per minibatch: --clip_minibatch must be >= 2, "
                     f"got {args.clip_minibatch}")


def _check_env(parser, env_name):
    """The env's spec, or an error for an unknown env or one this PPO cannot act in."""
    try:
        spec = envs.env_spec(env_name)
    except envs.UnknownEnvError as e:
        parser.error(str(e))
    if spec.discrete or len(spec.obs_shape) != 1:
        parser.error(f"env {env_name!r} has {'discrete actions' if spec.discrete else 'image observations'}; "
                     f"this PPO needs vector observations and continuous actions (e.g. HalfCheetah-v5, Pendulum-v1)")
    return spec


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the script's docstring as written and shows each flag's default."""


def main(argv, description, default_batch_size, default_num_samplers, allow_num_samplers=True):
    """Parses and checks the flags, then trains (or tests, or exports); returns the process exit status."""
    parser = make_parser(description, default_batch_size, default_num_samplers)
    args = with_saved_flags(parser, argv, parser.parse_args(argv))
    if not allow_num_samplers and args.num_samplers != 1 and args.mode != "export":  # an export samples nothing
        parser.error("ppo_main.py runs one process (-n 1); use ppo_parallel_main.py for -n N")
    spec = check_arguments(parser, args)
    from walle import training  # TensorFlow loads here, once the flags are known to be good
    from walle.checkpoint import CheckpointError
    try:
        if args.mode == "export":
            from walle import export
            export.export_run(args, spec)
            return 0
        return training.test(args, spec) if args.mode == "test" else training.train(args, spec)
    except (CheckpointError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def make_parser(description, default_batch_size, default_num_samplers):
    """The mains' parser. @FILE reads flags from a file, so a tested recipe
    (configs/ppo_halfcheetah.args) is one word on the command line, as IMPALA's --flagfile is."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter,
                                     fromfile_prefix_chars="@")
    parser.convert_arg_line_to_args = _recipe_line
    return add_arguments(parser, default_batch_size, default_num_samplers)


def _recipe_line(line):
    """A recipe file's line: flags and their values split on spaces; '#' starts a comment."""
    return line.split("#", 1)[0].split()


def with_saved_flags(parser, argv, args):
    """--mode=train_w_load / test / export: the saved run's flags, overridden by those on the command line
    (argparse fills in a default only where the namespace has no value yet); the run folder stays
    the log folder unless --logdir is given."""
    if args.mode == "train":
        if args.env_name is None:
            parser.error("the env_name argument is required, e.g. HalfCheetah-v5")
        return args
    if not args.load_model_url:
        parser.error(f"--mode={args.mode} needs --load_model_url (a run folder or its checkpoints/ckpt-N)")
    try:
        saved = config.load_flags(args.load_model_url)
    except ValueError as e:
        parser.error(str(e))
    keep = {k: v for k, v in saved.items()
            if k not in ("mode", "load_model_url", "logdir", "env_name", "export_dir", "export_onnx")}
    resumed = parser.parse_args(argv, argparse.Namespace(**keep))
    resumed.env_name = resumed.env_name or saved.get("env_name")
    changed = config.changed_fixed_flags(saved, resumed)
    if changed:
        parser.error("a resume keeps the nets of the run it continues: " + "; ".join(changed))
    resumed.logdir = resumed.logdir or config.run_folder(args.load_model_url)
    return resumed
