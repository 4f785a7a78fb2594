"""What the bench scripts share: matplotlib without a display, and saving a figure next to its table."""
import matplotlib

matplotlib.use("Agg")  # before pyplot: the benches run on machines with no display
import matplotlib.pyplot as plt  # noqa: E402


def subplots(*args, **kwargs):
    """plt.subplots on the Agg backend."""
    return plt.subplots(*args, **kwargs)


def save_figure(fig, path):
    """Writes the figure as a PNG (100 dpi, tight layout) and frees it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
