import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

export default defineConfig(packageBuild);
