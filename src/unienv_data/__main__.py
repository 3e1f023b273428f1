"""`python -m unienv_data ...`: the `unienv-data` command line (see `unienv_data.cli`)."""
from unienv_data.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
