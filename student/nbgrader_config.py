# The students' nbgrader settings, read where JUPYTER_CONFIG_PATH=student (the README's `jupyter lab labs/`, and
# `nbgrader validate` run with it): JupyterLab's Validate button and the command.
c = get_config()  # noqa: F821 - nbgrader's config loader defines it

# Validate cuts each line of a failed test's output at this width (90 by default). fuselab's reports explain a
# failure in lines of up to several hundred characters, and what the cut removed was the explanation.
c.Validator.width = 1000
