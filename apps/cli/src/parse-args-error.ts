import { HybridgenError } from "@hybridgen/core";

/** node:util parseArgs errors → one short line that says what to fix. */
export function parseArgsError(e: unknown, command: string): Error {
  if (!(e instanceof Error)) return new HybridgenError(String(e));
  const code = (e as { code?: string }).code;
  const quoted = /'([^']+)'/.exec(e.message)?.[1];
  const see = `(see ${command} --help)`;
  switch (code) {
    case "ERR_PARSE_ARGS_UNKNOWN_OPTION":
      return new HybridgenError(`unknown option ${quoted ?? ""} for ${command} ${see}`, "EUSAGE");
    case "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL":
      return new HybridgenError(`unexpected argument ${JSON.stringify(quoted ?? "")} for ${command} ${see}`, "EUSAGE");
    case "ERR_PARSE_ARGS_INVALID_OPTION_VALUE": {
      // Name the long form even when the user typed the short one ("-p, --prompt <value>").
      const flag = /--[a-z][\w-]*/.exec(e.message)?.[0] ?? quoted?.split(/[ ,]/)[0] ?? "an option";
      if (/ambiguous/.test(e.message)) {
        return new HybridgenError(`option ${flag} needs a value; for a value starting with '-' write ${flag}=VALUE`, "EUSAGE");
      }
      if (/argument missing/.test(e.message)) return new HybridgenError(`option ${flag} needs a value`, "EUSAGE");
      return new HybridgenError(`option ${flag} takes no value`, "EUSAGE");
    }
    default:
      return new HybridgenError(e.message.split("\n")[0]!, "EUSAGE");
  }
}
