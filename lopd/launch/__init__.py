"""``lopd launch``: run the out-of-date stages of ``dvc.yaml`` on a Ray cluster, then fan in.

``run`` is the command, ``plan`` reads the stage graph, ``worktree`` prepares each job's copy of the
repository, ``job`` runs one stage there and ``watchdog`` stops a job's process group when it is cancelled.
"""
