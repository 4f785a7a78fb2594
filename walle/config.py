"""What WALL-E's command line and its agent both read, importable without TensorFlow (so --help
and the argument checks answer before TensorFlow loads)."""


def parse_hidden(text):
    """--hidden "256,256" -> (256, 256); "" -> None (WALL-E's widths from --hid_mult)."""
    if not text.strip():
        return None
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise ValueError(f"--hidden must be comma-separated positive widths such as 256,256, got {text!r}")
    return widths
