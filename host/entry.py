"""The ``loghost`` command's entry point: the server's CLI when ``loghost[server]`` is installed,
else one line saying so (a bare install is only the client; its modules must not be needed)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``host.cli.main``; exit 2 with one line when the server's dependencies are missing."""
    try:
        from .cli import main as cli_main
    except ModuleNotFoundError as e:
        print(
            f"loghost: error: the server is not installed (no module {e.name!r}): "
            "pip install 'loghost[server]'",
            file=sys.stderr,
        )
        return 2
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
