import pytest

from tests.support.geometry_fixture import planted_geometry


@pytest.fixture(scope="session")
def planted_geometry_result(planted_dir):
    """`(loaded, GeometryResult)` of the planted model, computed once (`planted_geometry`)."""
    return planted_geometry(planted_dir)
