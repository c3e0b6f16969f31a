"""The course's machinery: pitfall and exercise records, the widget, the catalogue, the notebook runner, the doctor.

Nothing here is for a learner's own code; the tools at the top of ptlab are.
"""
