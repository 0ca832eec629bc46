"""The serving process of effectlog: one node of the projection cluster.

:mod:`.node` wires the projector, recovery, reconciler, metrics and the query API;
:mod:`.grouping` says where its partitions come from (the consumer group, standby copies);
:mod:`.gate` says which partitions are served and waits on their progress;
:mod:`.recovering` runs recovery and the reconciler over them (:mod:`.recover_route`: a
pass asked for by hand, on every member); :mod:`.health` and :mod:`.readiness` answer
``/healthz`` and ``/readyz``; :mod:`.http_api` is the aiohttp application;
:mod:`.forwarding` finds and asks a partition's owner; :mod:`.server` runs the HTTP event loop.
"""
