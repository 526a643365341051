/**
 * The repository's READMEs as the README checks read them: the root's and every workspace's, their
 * fenced shell blocks split into commands, and their markdown tables.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** Every README the checks cover, relative to the root: the root's, then packages/* and apps/* (the notebook is not a README). */
export function readmePaths(root: string): string[] {
  const out = ["README.md"];
  for (const base of ["packages", "apps"]) {
    const dir = join(root, base);
    if (!existsSync(dir)) continue;
    for (const name of readdirSync(dir).sort()) if (existsSync(join(dir, name, "README.md"))) out.push(`${base}/${name}/README.md`);
  }
  return out;
}

export interface ReadmeCommand {
  /** The README (relative to the root) and the 1-based line the command starts on. */
  readonly readme: string;
  readonly line: number;
  /** The command as a shell would run it: continuation lines joined, a trailing comment dropped, a here-document kept whole. */
  readonly text: string;
}

const SHELL_FENCE = /^```(sh|bash|shell|console)\s*$/;

/** A trailing `# comment` outside quotes, dropped. */
function dropComment(line: string): string {
  let quote = "";
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = "";
    } else if (c === "'" || c === '"') quote = c;
    else if (c === "#" && (i === 0 || /\s/.test(line[i - 1]!))) return line.slice(0, i).trimEnd();
  }
  return line.trimEnd();
}

/** The commands of every shell-fenced block of `text` (a README's contents). */
export function shellCommands(readme: string, text: string): ReadmeCommand[] {
  const lines = text.split("\n");
  const out: ReadmeCommand[] = [];
  let inShell = false, inFence = false;
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!;
    if (raw.startsWith("```")) {
      if (inFence) inFence = inShell = false;
      else {
        inFence = true;
        inShell = SHELL_FENCE.test(raw);
      }
      continue;
    }
    if (!inShell) continue;
    let cmd = dropComment(raw).trim();
    if (!cmd) continue;
    const start = i + 1;
    while (cmd.endsWith("\\") && i + 1 < lines.length) cmd = `${cmd.slice(0, -1).trimEnd()} ${dropComment(lines[++i]!).trim()}`;
    const heredoc = /<<-?\s*'?(\w+)'?/.exec(cmd);
    if (heredoc) {
      const body: string[] = [];
      while (i + 1 < lines.length && lines[i + 1] !== heredoc[1]) body.push(lines[++i]!);
      i++;
      cmd = [cmd, ...body, heredoc[1]].join("\n");
    }
    out.push({ readme, line: start, text: cmd });
  }
  return out;
}

export interface ReadmeTable {
  readonly readme: string;
  /** 1-based line of the header row, and the rows (header, separator, body) as written. */
  readonly line: number;
  readonly rows: readonly string[];
}

/** Every markdown table of `text`, outside fenced blocks. */
export function markdownTables(readme: string, text: string): ReadmeTable[] {
  const lines = text.split("\n");
  const out: ReadmeTable[] = [];
  let inFence = false;
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]!.startsWith("```")) inFence = !inFence;
    if (inFence || !lines[i]!.startsWith("|") || !/^\|[\s:|-]+\|$/.test(lines[i + 1] ?? "")) continue;
    const start = i;
    while (i < lines.length && lines[i]!.startsWith("|")) i++;
    out.push({ readme, line: start + 1, rows: lines.slice(start, i) });
    i--;
  }
  return out;
}

export const readText = (root: string, path: string): string => readFileSync(join(root, path), "utf8");
