"""The engine of ``effectlog demo``: a simulated agent workload with real crashes.

``workload`` plans the jobs and their faults from a seed, ``pool`` is the job queue that
feeds worker processes and re-delivers the jobs of the ones that die, ``worker_main`` and
``naive`` are the two kinds of worker process, ``settle`` runs projection, recovery and
reconciliation beside them, ``report`` turns the outcome into figures, ``run`` ties one
demo run together and ``progress`` shows it.
"""
