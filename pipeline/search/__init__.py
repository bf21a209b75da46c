"""``docintel search`` and ``docintel index``: the query, what they read from a committed
run, and the approximate nearest-neighbour index."""
