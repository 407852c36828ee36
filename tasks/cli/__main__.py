"""`python -m tasks.cli`: the `agentjobs` command, for where its script is not on PATH."""

from tasks.cli import main

main()
