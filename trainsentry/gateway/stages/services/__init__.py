"""The services beside the pipeline: what the handlers, the planning steps and the ticker
call on (acks and who acknowledged, paging and its escalations, maintenance windows, on-call
rotas and handoffs, cordons and their evidence, TrainingJobs' routes and status, the
topology, Alertmanager silences, retention). The pipeline's own steps are stages/
(intake, resends, truncated, outbox), its engines stages/planning/ and stages/hang/."""
