"""`edge-appliance fleet ...`: the operator's side of staged rollouts (docs/fleet.md).

The devices read the rollout documents and write their reports in the bucket they poll
(appliance/repository/rollout.py holds the formats, the membership and the halt rule); this
package writes the documents and reads the reports: `bucket.py` (the S3 client), `publish.py`
and `control.py` (the writes), `view.py` (`fleet status`), `ops.py` (the command line).
"""
