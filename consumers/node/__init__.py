"""The serving process of effectlog: one node of the projection cluster.

:mod:`.node` wires the projector, recovery, reconciler, metrics and the query API;
:mod:`.gate` says which partitions are served and waits on their progress;
:mod:`.http_api` is the aiohttp application; :mod:`.forwarding` finds and asks a
partition's owner; :mod:`.server` runs the HTTP event loop; :mod:`.view` is the node's
read-your-writes view for its own reconciler.
"""
