"""Exception hierarchy of leechq.

Every error the library raises on purpose derives from :class:`LeechqError`, so callers can catch
leechq's own failures without swallowing unrelated bugs. Subclasses that describe bad input also
derive from :class:`ValueError` so that ``except ValueError`` keeps working for users who expect it.
"""

from __future__ import annotations


class LeechqError(Exception):
    """Base class of every error leechq raises deliberately."""


class InvalidInput(LeechqError, ValueError):
    """An argument is malformed: wrong shape, dtype, non-finite values, out-of-range labels."""


class UnsupportedShape(InvalidInput):
    """A tensor shape no codebook, layout or kernel supports (e.g. a width that is not a multiple of 24)."""


class NotInCodebook(InvalidInput):
    """A point is not a member of the lattice or lies outside the codebook's ball."""


class ArtifactError(LeechqError, ValueError):
    """A file or directory is corrupt, truncated, inconsistent with its header, or of an unknown kind."""


class IncompatibleVersion(ArtifactError):
    """An artifact declares a schema or layout version this build cannot read."""


class FingerprintMismatch(ArtifactError):
    """A stored codebook fingerprint or table digest differs from the one this build implements."""


class KernelUnavailable(LeechqError, RuntimeError):
    """No kernel can implement the requested op on this device; the message lists every reason."""


class UnsupportedArchitecture(LeechqError, ValueError):
    """A model architecture leechq does not know how to quantize or serve."""
