"""User-facing errors: what went wrong and how to fix it, in one line.

The CLI turns every TbsError into a single stderr line and exit code 2, so a
user's mistake never ends in a traceback.
"""


class TbsError(Exception):
    """A problem the user can fix; the message names the bad value and the fix."""


class ModelLoadError(TbsError):
    """The model file is missing, corrupt, not a Keras model, or needs custom classes."""


class InputDataError(TbsError):
    """The --input data does not fit the model's inputs."""


class DeviceError(TbsError):
    """None of the requested devices can be used."""


class ProfileError(TbsError):
    """A profile directory is missing, unfinished, or belongs to another model."""


class TbsWarning(UserWarning):
    """Something the user should know that does not stop the run (a device skipped, a guessed shape).

    The CLI prints each as one ``Warning: ...`` line; in Python they are ordinary warnings.
    """
