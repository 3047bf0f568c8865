"""Wrong milestone answers for the projects: each takes the good (task, record, state) and breaks one thing."""
import copy
import dataclasses


def untrained(task, record, state):
    return task, record, {k: v.clone() for k, v in task.build_model().state_dict().items()}


def single_process(task, record, state):
    rec = copy.copy(record)
    rec.summary = {**record.summary, "world_size": 1}
    return task, rec, state


def over_budget(task, record, state):
    rec = copy.copy(record)
    rec.summary = {**record.summary, "train_time": 1e4}
    return task, rec, state


def stale_running_stats(task, record, state):
    out = {k: v.clone() for k, v in state.items()}
    for k in out:
        if k.endswith("running_mean"):
            out[k].zero_()
        elif k.endswith("running_var"):
            out[k].fill_(1.0)
    return task, record, out


def trained_on_test_split(task, record, state):
    return dataclasses.replace(task, holdout=0.05), record, state


def look_ahead(task, record, state):
    return dataclasses.replace(task, train_end="2018-12-31"), record, state


def no_costs(task, record, state):
    return dataclasses.replace(task, cost=0.0), record, state


VISION = [untrained, single_process, stale_running_stats, trained_on_test_split, over_budget]
FINANCE = [untrained, single_process, look_ahead, no_costs]
