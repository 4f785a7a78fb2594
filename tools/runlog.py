"""A run folder's rows: one CSV file and the same scalars in TensorBoard, written by every trainer
(the IMPALA learner's metrics.csv, the evaluator's eval.csv, WALL-E's progress.csv) and read back by
tools/plotcurve.py.

TensorBoard tags are namespaced the way CleanRL's are, so the three kinds of figure sort apart:
`charts/` (returns and episode lengths), `losses/` (what the update minimises and its diagnostics),
`perf/` (rates, timings, fill levels). The caller names each column's tag; a column without one is
written to the CSV only.
"""
import csv
import math
import os

import numpy as np

EMPTY = ""  # a cell with no value yet (no episode has ended): plots skip it


def format_cell(x):
    """None -> empty; NaN -> 'nan'; floats to 6 significant digits, but large ones (Unix times,
    frame counts) to 0.1 so no digit before the point is lost; everything else as str."""
    if x is None:
        return EMPTY
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isnan(x):
            return "nan"
        return f"{x:.1f}" if abs(x) >= 1e5 else f"{x:.6g}"
    return str(x)


def is_missing(cell):
    """Whether a CSV cell written by format_cell holds no number."""
    return cell is None or cell.strip() in (EMPTY, "nan")


class RunLog:
    """Appends rows to `csv_path` (header written once, so a resumed run continues the same file)
    and writes each tagged column to TensorBoard at the row's step.

    `tags` maps a column (or any other key of the rows) to its TensorBoard tag; keys of a row that
    are not CSV columns but have a tag go to TensorBoard only; None and NaN (no episode ended
    yet) are left out of TensorBoard. `tensorboard_dir=None` skips
    TensorBoard (for ranks that write nothing)."""

    def __init__(self, csv_path, columns, tensorboard_dir, tags=None, append=True):
        self.columns, self.tags = list(columns), dict(tags or {})
        os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
        new_file = not append or not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
        if not new_file:
            self.columns = _widen(csv_path, self.columns)
        self.file = open(csv_path, "a" if append else "w", newline="", buffering=1)
        self.csv = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
        if new_file:
            self.csv.writeheader()
        self.writer = None
        if tensorboard_dir is not None:
            import tensorflow as tf  # only where TensorBoard is written: plots read CSVs without it
            self.writer = tf.summary.create_file_writer(tensorboard_dir)

    def tag(self, key, tag):
        """Adds or changes one key's TensorBoard tag (for keys known only once training runs)."""
        self.tags[key] = tag

    def write(self, row, step):
        self.csv.writerow({k: format_cell(row.get(k)) for k in self.columns})
        self.file.flush()
        if self.writer is None:
            return
        import tensorflow as tf
        with self.writer.as_default(step=int(step)):
            for key, value in row.items():
                if key in self.tags and value is not None and not math.isnan(float(value)):
                    tf.summary.scalar(self.tags[key], float(value))

    def close(self):
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def drop_rows_after(csv_path, column, limit) -> int:
    """Removes the rows whose `column` is above `limit` (a run resumed from a checkpoint older than
    its last rows: the training they describe was lost), so the file stays one curve with no step
    back; returns how many went."""
    if not os.path.exists(csv_path):
        return 0
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), list(reader)
    kept = [r for r in rows if is_missing(r.get(column)) or float(r[column]) <= limit]
    if len(kept) < len(rows):
        _rewrite(csv_path, header, kept)
    return len(rows) - len(kept)


def _rewrite(csv_path, header, rows):
    """The file as `header` and `rows`, through a temporary file: a crash leaves the old file whole."""
    tmp = csv_path + ".rewrite"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, header, restval=EMPTY, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, csv_path)


def _widen(csv_path, columns):
    """The columns a resumed run appends under: a file written by a version with fewer columns is
    rewritten once with the new ones added (their old cells empty), so every row keeps one header
    and readers find each figure by name; a column the file has and `columns` lacks is kept, last.
    The rewrite goes through a temporary file, so a crash leaves the old file whole."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        have = list(reader.fieldnames or [])
        if set(columns) <= set(have):
            return have
        rows = list(reader)
    if list(columns[:len(have)]) == have:
        # Rows a version appended under an older, shorter header carry their newer cells past its
        # end (csv keeps them under the key None); they belong to the columns that follow it.
        for row in rows:
            row.update(zip(columns[len(have):], row.pop(None, [])))
    widened = list(columns) + [c for c in have if c not in columns]
    _rewrite(csv_path, widened, rows)
    return widened
