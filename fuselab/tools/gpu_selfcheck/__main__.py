import sys

from .command import main

if __name__ == "__main__":  # a process the self-check starts with spawn imports this module again
    sys.exit(main())
