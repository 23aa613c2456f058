"""`python -m lmscope` runs the command line."""
from lmscope.cli import main

main()
