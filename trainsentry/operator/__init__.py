"""The TrainingJob operator (kopf): see docs/operator.md. `trainsentry operator` runs it;
the gateway records alerts on jobs with `trainsentry.operator.status.patch_last_alert`."""
