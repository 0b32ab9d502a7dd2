"""Core API, step 1: report metrics from a plain loop (Determined's tutorial, ported)."""

import logging
import time

import assay.core


def main(core_context: assay.core.Context, increment_by: int) -> None:
    x = 0
    steps_completed = 0
    for batch in range(100):
        x += increment_by
        steps_completed = batch + 1
        time.sleep(0.001)
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
    core_context.train.report_validation_metrics(steps_completed=steps_completed, metrics={"x": x})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with assay.core.init() as core_context:
        main(core_context=core_context, increment_by=1)
