"""The template of a project: copy this folder to ``simlib/projects/<name>/``, rename the task, and add the line
``register("<name>", "simlib.projects.<name>.run", "one line about it")`` to ``simlib/projects/registry.py``.

It is a small MLP regressing disease progression on scikit-learn's diabetes data (442 patients, 10 features; the
data ships inside scikit-learn, BSD licence: nothing downloads). ``tests/test_project_template.py`` copies it into
a temporary folder, registers it, and runs ``simlib train``, its dry runs, ``simlib plan`` and its milestone on it.
This folder itself is not registered.
"""

from .task import DiabetesTask  # noqa: F401
