"""Day two: a change through a fleet behind the router, one batch of hosts at a time, each taken
out of the router and drained before its server restarts and put back once it serves again
(``order``: batches and stop rules; ``forecast``: which servers a run would restart; ``drain``: the
router's side; ``roll``: the runs)."""
