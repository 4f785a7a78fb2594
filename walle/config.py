"""What WALL-E's command line and its agent both read, importable without TensorFlow (so --help
and the argument checks answer before TensorFlow loads)."""
import json
import os
import re

from tools.digits import is_digits, odd_char
from tools.files import write_json


def parse_hidden(text):
    """--hidden "256,256" -> (256, 256); "" -> None (WALL-E's widths from --hid_mult)."""
    if not text.strip():
        return None
    items = [w.strip() for w in text.split(",")]  # spaces around the commas, as absl's list flags
    if not all(is_digits(w) and int(w) > 0 for w in items):  # int() would read '２５６' as 256
        raise ValueError(f"--hidden must be comma-separated positive widths such as 256,256, got {text!r}"
                         f"{odd_char(text)}")
    return tuple(int(w) for w in items)


# The run folder: its flags, which --mode=train_w_load and --mode=test start from.

FLAGS_FILE = "flags.json"
CHECKPOINT_DIR = "checkpoints"
# Flags that shape the variables: a resume with other values could not load the checkpoint.
FIXED_FLAGS = ("env_name", "hidden", "hid_mult", "activation", "value_fit")


def run_folder(url):
    """The run folder of --load_model_url: the folder itself, or the one holding a checkpoint
    prefix (<run>/checkpoints/ckpt-N)."""
    url = url.rstrip("/")
    if re.fullmatch(r"ckpt-[0-9]+", os.path.basename(url)):  # \d would take 'ckpt-٣' too
        return os.path.dirname(os.path.dirname(url))
    return os.path.dirname(url) if os.path.basename(url) == CHECKPOINT_DIR else url


def save_flags(logdir, args):
    write_json(os.path.join(logdir, FLAGS_FILE), vars(args), indent=1, sort_keys=True)


def load_flags(url):
    """The saved flags (a dict) of the run --load_model_url names; ValueError saying what is wrong."""
    path = os.path.join(run_folder(url), FLAGS_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--load_model_url={url}: cannot read the run's flags {path} ({e}); point it at "
                         f"a WALL-E run folder or one of its {CHECKPOINT_DIR}/ckpt-N")


def changed_fixed_flags(saved, args):
    """The flags a resume cannot change that the command line changed, with both values."""
    return [f"--{k} {saved[k]!r} (saved) vs {getattr(args, k)!r}" for k in FIXED_FLAGS
            if k in saved and saved[k] != getattr(args, k)]
