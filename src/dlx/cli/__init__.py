"""The `dlx` console command: one Typer app, one module of subcommands per concern."""
