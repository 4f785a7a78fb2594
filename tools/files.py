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
