"""The test suite: folders mirror the package's layers; shared helpers beside the tests that use them."""
