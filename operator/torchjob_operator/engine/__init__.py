"""The operator's shared, impure machinery, for every controller: the ``Kube`` protocol and
its client, the read cache, the pod watch, leader election, settings, metrics, memory
trimming and the work queue. Nothing here knows a controller's rules."""
