"""Numbers a user typed (flags, workers CSV cells, environment variables, comma lists): ASCII
digits only. str.isdigit() passes superscripts ('¹') that int() then rejects with a traceback, and
int() and float() take other scripts' digits ('٣', '３'), spaces around and underscores inside
('1_000'): such a value is a typo to name, never a number to guess at. Every package may import
this module (tools/ imports no other package of the project)."""
import argparse
import re
import unicodedata

from absl import flags

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_SIGNED = re.compile(r"[+-]?[0-9]+", re.ASCII)
# float()'s spellings of infinity and NaN stay accepted: each caller's range check decides on them
_FLOAT = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)",
                    re.ASCII | re.IGNORECASE)
_INT_RULE = "write ASCII digits 0-9 only"
_SIGNED_RULE = "write ASCII digits 0-9, after a - for a negative one"
_FLOAT_RULE = "write ASCII digits 0-9 with an optional . and exponent, e.g. 0.5 or 1e-4"


class NumberError(ValueError):
    """Text that is not an ASCII number; one line naming the value and what would be right."""


def is_digits(text, signed=False) -> bool:
    """Whether `text` is ASCII digits (after one optional sign if `signed`), nothing else."""
    return isinstance(text, str) and bool((_SIGNED if signed else _DIGITS).fullmatch(text))


def odd_char(text) -> str:
    """The first non-ASCII character of `text` by its Unicode name, as " ('３' is FULLWIDTH DIGIT
    THREE)", or "": in a message the value can look like plain digits."""
    c = next((c for c in str(text) if not c.isascii()), None)
    return "" if c is None else " (%r is %s)" % (c, unicodedata.name(c, "U+%04X" % ord(c)))


def parse_int(text, name=None, signed=False) -> int:
    """`text` as an int if is_digits(text, signed), else NumberError naming `name` and the value."""
    if not is_digits(text, signed):
        raise NumberError(_message(text, name, "an integer" if signed else "a whole number",
                                   _SIGNED_RULE if signed else _INT_RULE))
    return int(text)


def parse_float(text, name=None) -> float:
    """`text` as a float if it is an ASCII decimal or exponent number, else NumberError."""
    if not isinstance(text, str) or not _FLOAT.fullmatch(text):
        raise NumberError(_message(text, name, "a number", _FLOAT_RULE))
    return float(text)


def _message(text, name, kind, rule):
    where = "%s: " % name if name else ""
    return "%s%r is not %s; %s%s" % (where, text, kind, rule, odd_char(text))


# argparse types: argparse prints the message after "argument --name: " and exits 2
def int_arg(text) -> int:
    try:
        return parse_int(text, signed=True)
    except NumberError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def float_arg(text) -> float:
    try:
        return parse_float(text)
    except NumberError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _AsciiIntegerParser(flags.IntegerParser):
    def convert(self, argument):
        return super().convert(parse_int(argument, signed=True) if isinstance(argument, str) else argument)


class _AsciiFloatParser(flags.FloatParser):
    def convert(self, argument):
        return super().convert(parse_float(argument) if isinstance(argument, str) else argument)


def strict_number_flags(flag_values):
    """Every absl integer and float flag defined so far parses ASCII text only: absl's own
    parsers take whatever int() and float() take. A bad value is absl's one-line flag error,
    `flag --batch_size=３２: '３２' is not an integer; ...`. Bounds and help text stay."""
    strict = {flags.IntegerParser: _AsciiIntegerParser, flags.FloatParser: _AsciiFloatParser}
    for name in list(flag_values):
        flag = flag_values[name]
        if type(flag.parser) in strict:
            flag.parser = strict[type(flag.parser)](flag.parser.lower_bound, flag.parser.upper_bound)
