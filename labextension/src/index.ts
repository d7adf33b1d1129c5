// fuselab's Validate button for the students' JupyterLab (student/: nbgrader's own button is disabled there).
// It exists because nbgrader's dialog prints a fixed "Success!" and ignores the rest of the server's reply, so it
// cannot say what the course's validator adds (student/nbgrader_config.py): how many points a machine without a
// GPU could not measure. Everything else is nbgrader's: the same request to its server extension, the same
// outcomes (success, failed cells with their errors, changed cells, errors).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, showDialog, ToolbarButton } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

// the key student/nbgrader_config.py adds to the validator's results (nbgrader's own client ignores it)
const NOTE_KEY = 'fuselab_not_measured';

interface ICell {
  source: string;
  error?: string;
  old_type?: string;
  new_type?: string;
}

interface IResults {
  type_changed?: ICell[];
  changed?: ICell[];
  passed?: ICell[];
  failed?: ICell[];
  [NOTE_KEY]?: string;
}

async function validate(path: string): Promise<{ success: boolean; value: IResults | string }> {
  // as nbgrader's button: POST assignments/validate?path=... to nbgrader's validate_assignment server extension
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'assignments/validate') + '?' + new URLSearchParams({ path }).toString();
  const response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  const reply = await response.json();
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, reply.message);
  }
  return reply;
}

function add(parent: HTMLElement, tag: string, text: string, html = false): HTMLElement {
  const node = document.createElement(tag);
  if (html) {
    node.innerHTML = text; // nbgrader's ansi2html output: escaped text in colour spans
  } else {
    node.innerText = text;
  }
  parent.append(node);
  return node;
}

function report(reply: { success: boolean; value: IResults | string }): HTMLElement {
  const body = document.createElement('div');
  body.id = 'validation-message';
  if (reply.success !== true) {
    add(body, 'p', 'There was an error running the validate command:');
    add(body, 'pre', String(reply.value));
    return body;
  }
  const results: IResults = typeof reply.value === 'string' ? JSON.parse(reply.value) : reply.value;
  if (results.type_changed) {
    for (const cell of results.type_changed) {
      add(body, 'p', `The following ${cell.old_type} cell has changed to a ${cell.new_type} cell, but it should not have!`);
      add(body, 'pre', cell.source);
    }
  } else if (results.changed) {
    for (const cell of results.changed) {
      add(body, 'p', 'The source of the following cell has changed, but it should not have!');
      add(body, 'pre', cell.source);
    }
  } else if (results.passed) {
    for (const cell of results.passed) {
      add(body, 'p', 'The following cell passed:');
      add(body, 'pre', cell.source);
    }
  } else if (results.failed) {
    for (const cell of results.failed) {
      add(body, 'p', 'The following cell failed:');
      add(add(body, 'div', ''), 'pre', cell.source).parentElement!.classList.add('jp-RenderedText');
      add(add(body, 'div', ''), 'pre', cell.error || '', true).parentElement!.classList.add('jp-RenderedText');
    }
  } else {
    add(body, 'p', 'Success! Your notebook passes all the tests.');
  }
  if (results[NOTE_KEY]) {
    add(body, 'p', results[NOTE_KEY]!).classList.add('fuselab-not-measured');
  }
  return body;
}

class ValidateButton extends ToolbarButton {
  constructor(private panel: NotebookPanel) {
    super({ className: 'validate-button', label: 'Validate', tooltip: 'Validate Assignment', onClick: () => this.run() });
  }

  private label(text: string): void {
    const node = this.node.getElementsByClassName('jp-ToolbarButtonComponent-label')[0] as HTMLElement | undefined;
    if (node) {
      node.innerText = text;
    }
  }

  private async run(): Promise<void> {
    this.enabled = false;
    try {
      this.label('Saving...');
      await this.panel.context.save(); // the server validates the file on disk
      this.label('Validating...');
      const reply = await validate(this.panel.context.path);
      await showDialog({ title: 'Validation Results', body: new Widget({ node: report(reply) }),
                         buttons: [Dialog.okButton()] });
    } catch (error) {
      await showDialog({ title: 'Validation failed', body: `Cannot validate: ${error}`, buttons: [Dialog.okButton()] });
    } finally {
      this.label('Validate');
      this.enabled = true;
    }
  }
}

class ButtonExtension implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  createNew(panel: NotebookPanel): IDisposable {
    const button = new ValidateButton(panel);
    let index = 0; // before the toolbar's spacer, where nbgrader puts its button
    for (const item of panel.toolbar.children()) {
      if (!item || item.node.classList.contains('jp-Toolbar-spacer')) {
        break;
      }
      index++;
    }
    panel.toolbar.insertItem(index, 'fuselab-validate', button);
    return button;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@fuselab/validate:plugin',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', new ButtonExtension());
  }
};

export default plugin;
