"""The gateway's HTTP surface: the app's routes and thin handlers (app.py), one module per
API (alerts read, acks, incidents, maintenance, on-call, nodes, cordon), and what every
handler shares: authentication (auth.py), body limits (limits.py), bodies (request_body.py)
and path ids (path_ids.py). The console's pages are gateway/ui/."""
