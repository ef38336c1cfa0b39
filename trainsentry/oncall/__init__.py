"""On-call schedules and maintenance windows: types, pure schedule math, configuration,
iCalendar rendering and the `trainsentry oncall` command (docs/oncall.md)."""
