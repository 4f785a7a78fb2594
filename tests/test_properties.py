"""Property-based bad-input suites (hypothesis): whatever the input, the workers CSV
parser, the replay JSON parser and the flag parser either accept it or raise their one
clear error type with a message that names the place (file:line, the flag); never
another exception (which would reach the user as a traceback). Digits of other scripts
are never numbers. The draws are derandomized unless HYPOTHESIS_PROFILE=random
(tests/conftest.py)."""
import json
import os
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cluster import workers_csv
from impala import replay
from tools import digits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# max_examples, derandomize and database come from the loaded profile (tests/conftest.py)
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
HEADER = "job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password"

cell = st.one_of(st.sampled_from(["learner", "actor", "127.0.0.1", "localhost", "10.0.0.2", "8001", "0",
                                  "65536", "-1", "22", "root", "", "\"0,1\"", "abc", "1.5", "::1",
                                  "999.1.1.1", "a b", "ünï", "\"", ",", "key.pem", "¹²", "٣٤", "８０"]),
                 st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12))
row = st.lists(cell, min_size=0, max_size=9).map(lambda cells: ",".join(cells))


@SETTINGS
@example(rows=["learner,127.0.0.1,¹,,,,"], header=HEADER)  # a random draw's find: int('¹') was a traceback
@given(rows=st.lists(row, max_size=6), header=st.sampled_from([HEADER, HEADER + ",ssh_key_file", "", "job,ip"]))
def test_workers_csv_never_crashes(tmp_path, rows, header):
    path = tmp_path / "workers.csv"
    path.write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    try:
        cluster = workers_csv.load(str(path), local={"127.0.0.1"})
    except workers_csv.WorkersCsvError as e:
        msg = str(e)
        assert str(path) in msg, msg  # names the file (and line, where there is one)
        assert "Traceback" not in msg
    else:
        assert cluster.learners, "an accepted CSV has at least one learner"


@SETTINGS
@given(rows=st.lists(row, min_size=1, max_size=4))
def test_workers_csv_errors_name_file_and_line(tmp_path, rows):
    path = tmp_path / "workers.csv"
    content = "\n".join([HEADER] + rows) + "\n"
    path.write_text(content, encoding="utf-8", newline="")
    n_lines = len(re.split(r"\r\n|\n|\r", content))
    try:
        workers_csv.load(str(path), local={"127.0.0.1"})
    except workers_csv.WorkersCsvError as e:
        problems = [ln.strip() for ln in str(e).splitlines()[1:]] or [str(e)]
        for p in problems:  # "<file>:<line>: what" or "<file>: what" (a whole-file problem)
            assert p.startswith(str(path) + ":"), p
            rest = p[len(str(path)) + 1:]
            if rest.split(":", 1)[0].strip().isdigit():
                assert 1 <= int(rest.split(":", 1)[0]) <= n_lines, p


json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10 ** 6), st.floats(allow_nan=True),
              st.text(max_size=10),
              st.sampled_from(["queue", "standard", "custom", "elite_sampling", "attentive_sampling",
                               "uniform", "kl_div", "ln_norm", "cos_dist", "elite_insertion", "fifo"])),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=8)
keys = st.sampled_from(["type", "capacity", "sample_ratio", "compress", "sample_strategy", "insert_strategy",
                        "dist_function", "p", "lambda_batch_multiplier", "alfa_annealing_factor",
                        "elite_sampling_strategy", "elite_batch_size", "bogus"])
entry = st.dictionaries(keys, json_value, max_size=6)


@SETTINGS
@given(entries=st.one_of(st.lists(entry, max_size=4), json_value))
def test_replay_parameters_never_crash(entries):
    text = json.dumps(entries)
    try:
        specs = replay.parse_replay_parameters(text)
    except replay.ReplayConfigError as e:
        assert "--replay_parameters" in str(e), str(e)
    else:
        assert abs(sum(s.sample_ratio for s in specs) - 1) < 1e-6
        replay.ReplayMixer(specs, batch_size=8)  # an accepted config builds


@SETTINGS
@given(text=st.text(max_size=60))
def test_replay_parameters_arbitrary_text(text):
    try:
        replay.parse_replay_parameters(text)
    except replay.ReplayConfigError as e:
        assert "--replay_parameters" in str(e)


@pytest.fixture(scope="module")
def experiment_flags():
    import experiment
    from absl import flags
    return experiment, flags


FLAG_NAMES = ["batch_size", "unroll_length", "learning_rate", "discounting", "entropy_cost", "learner_hosts",
              "actor_hosts", "reward_clipping", "queue_capacity", "mode", "job_name", "width", "decay",
              "envs_per_actor", "actor_threads", "learner_threads", "task", "no_such_flag"]


@SETTINGS
@given(pairs=st.lists(st.tuples(st.sampled_from(FLAG_NAMES),
                                st.one_of(st.text(max_size=12), st.integers(-5, 100).map(str),
                                          st.floats(allow_nan=True).map(str))), max_size=4))
def test_flag_parsing_gives_flag_errors_only(experiment_flags, pairs):
    experiment, flags = experiment_flags
    argv = ["experiment.py"] + ["--%s=%s" % (k, v) for k, v in pairs]
    try:
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
    except flags.Error as e:
        msg = str(e)
        assert any(k in msg for k, _ in pairs) or "flag" in msg.lower(), msg
    finally:
        flags.FLAGS.unparse_flags()


# Digits that are not ASCII 0-9: str.isdigit() passes them all (int() then refuses '¹²' with a
# traceback) and int() and float() read the others ('٣٤' as 34, '８０' as 80), with ASCII digits
# mixed in.
UNICODE_DIGITS = ("¹²", "٣٤", "８０")
digit = st.one_of(st.characters(whitelist_categories=("Nd", "No"), blacklist_characters="0123456789"),
                  st.sampled_from("0123456789"))
unicode_number = st.lists(digit, min_size=1, max_size=5).map("".join).filter(lambda t: not t.isascii())


def _with_examples(f):
    for value in UNICODE_DIGITS:
        f = example(value=value)(f)
    return f


def test_the_profile_decides_the_draws():
    assert SETTINGS.derandomize == settings.default.derandomize
    assert SETTINGS.database is settings.default.database and SETTINGS.max_examples == settings.default.max_examples


@SETTINGS
@_with_examples
@given(value=unicode_number)
def test_unicode_digits_are_never_numbers(value):
    for parse in (lambda v: digits.parse_int(v, "--width"), lambda v: digits.parse_int(v, "--width", signed=True),
                  lambda v: digits.parse_float(v, "--width")):
        with pytest.raises(digits.NumberError) as e:
            parse(value)
        assert str(e.value).startswith("--width: %r is not " % value) and "\n" not in str(e.value), str(e.value)
        assert "ASCII digits" in str(e.value) and " is " in digits.odd_char(value)


@SETTINGS
@_with_examples
@given(value=unicode_number)
def test_workers_csv_port_of_unicode_digits_names_line_and_column(tmp_path, value):
    path = tmp_path / "workers.csv"
    path.write_text("\n".join([HEADER, "learner,127.0.0.1,8001,,,,", "actor,127.0.0.1,%s,,,," % value]) + "\n",
                    encoding="utf-8")
    with pytest.raises(workers_csv.WorkersCsvError) as e:
        workers_csv.load(str(path), local={"127.0.0.1"})
    assert str(e.value).splitlines()[1:] == [
        "  %s:3: column 'tf_port': %r is not a port; write an integer in 1..65535 in ASCII digits%s"
        % (path, value, digits.odd_char(value))]


@SETTINGS
@_with_examples
@given(value=unicode_number)
def test_number_flags_of_unicode_digits_are_one_flag_error(experiment_flags, value):
    experiment, flags = experiment_flags
    for name in ("batch_size", "task", "learning_rate", "discounting"):
        try:
            flags.FLAGS.unparse_flags()
            with pytest.raises(flags.Error) as e:
                flags.FLAGS(["experiment.py", "--%s=%s" % (name, value)])
        finally:
            flags.FLAGS.unparse_flags()
        msg = str(e.value)
        assert msg.startswith("flag --%s=%s: %r is not " % (name, value, value)) and "\n" not in msg, msg
