# The students' JupyterLab loads the course's own Validate button from here (built by labextension/build), so it
# is found whatever folder JupyterLab starts in; student/labconfig/page_config.json disables nbgrader's.
import os

c = get_config()  # noqa: F821 - Jupyter's config loader defines it
c.LabApp.extra_labextensions_path = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "labextensions")]
