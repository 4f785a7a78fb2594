"""Files that a reader may open at any moment (a status command, a resume after a crash): written
whole to a temporary file beside them and renamed into place, so a reader sees the old file or the
new one, never half of either."""
import json
import os


def write_json(path, doc, **dump_args):
    """`doc` as JSON at `path`, atomically; `dump_args` go to json.dump (indent, default, ...)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, **dump_args)
    os.replace(tmp, path)


def read_records(path, key, make, what, instead):
    """The list under `key` of the JSON file at `path`, each item made into make(**item); [] when
    there is no file. A file that is not such a list (a hand edit, a disk that filled up) is named
    in one ValueError saying `what` it should hold and what moving it aside means (`instead`)."""
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            return [make(**item) for item in json.load(f)[key]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a list of {what} ({type(e).__name__}: {e}); move it aside to "
                         f"{instead}") from None


def remove_if_there(path):
    if os.path.exists(path):
        os.remove(path)
