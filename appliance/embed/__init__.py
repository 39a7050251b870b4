"""The embedding API: this server in the application's own process (issue 38).

`tritonserver` is a work-alike of Triton's in-process Python package of that name (`Server`,
`Options`, `Model.infer`, ...) and `tritonfrontend` of its front-end bindings (`KServeHttp`,
`KServeGrpc`, `Metrics`), so that porting is one import line::

    from appliance import tritonserver, tritonfrontend

A face-level entry like the command line: it builds the same composition root
(`appliance/server/app.py`'s `Appliance`) on an event loop in a background thread and calls the
inference and control services directly, without a socket. docs/compatibility.md lists what is
provided under Triton's names and what differs.

May import the server, flags, front ends, services and below (never the command line).
"""
