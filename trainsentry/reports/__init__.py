"""The weekly report: statistics over the store (stats), periods (period), charts, HTML/text/
CSV rendering and MIME (weekly), idempotent delivery (delivery, schedule), Feishu digest
(digest) and the `trainsentry report` command (command). See docs/reports.md."""
