"""The hang diagnosis, the gateway's engine for a job's hang: the probes' triggers taken in
(trigger.py, evidence.py), the ranks found (pods.py, diagnosis.py's resolvers), the culprit
located from little data (locate.py), dumps and stacks fetched and read bounded
(probe_client.py, probe_reading.py, stacks.py), analysed into a verdict (enrichment.py), and
the held page released with it (diagnosis.py, the policy's hold step)."""
