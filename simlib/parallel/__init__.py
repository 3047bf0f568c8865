"""Parallelism mechanisms, one file per concept: data, pipeline (schedules + executor), tensor, mesh."""
