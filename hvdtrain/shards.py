"""`python -m hvdtrain.shards write|verify`: an image folder or pickled indexes as tar shards, and
their check (the format, the writer and the reader: hvdtrain/data/shards.py)."""
from hvdtrain.data.shards import main

if __name__ == "__main__":
    main()
