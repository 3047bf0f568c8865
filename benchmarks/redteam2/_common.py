"""Registry for the red team's wrong answers: each answer is a factory (its docstring says the mistake or trick and
whether it is honest or deliberate) that returns the object a learner would hand to ``grading.check``."""


def answer(kind: str):
    """Mark a factory as one wrong answer of kind ``honest`` or ``deliberate``."""
    assert kind in ("honest", "deliberate"), kind

    def mark(factory):
        doc = (factory.__doc__ or "").strip()
        assert doc and "\n" not in doc, f"{factory.__name__}: a one-line docstring is required"
        factory.kind = kind
        return factory
    return mark


def answers_of(module) -> list:
    """The module's answer factories, in the order they are defined."""
    return [v for v in vars(module).values() if callable(v) and getattr(v, "kind", None) in ("honest", "deliberate")]
