"""`python -m dlx ...` (what torchrun starts) is the same as the `dlx` console command."""

from dlx.cli.app import main

if __name__ == "__main__":
    main()
