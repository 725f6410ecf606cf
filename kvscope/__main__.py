"""`python -m kvscope`: the `kvscope` command line (kvscope.cli.main)."""

from kvscope.cli import main

if __name__ == "__main__":
    main()
