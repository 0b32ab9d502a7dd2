import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// `npm run dev` serves the app with hot reload and sends /api to a master:
// ASSAY_MASTER_URL (default http://127.0.0.1:8080), e.g. the demo master of
// bench/webui_load.py --serve.
declare const process: { env: Record<string, string | undefined> };
const master = process.env.ASSAY_MASTER_URL ?? "http://127.0.0.1:8080";

export default defineConfig({
  plugins: [react()],
  base: "/",
  build: {
    outDir: "../src/assay/master/webui_dist",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
    chunkSizeWarningLimit: 400,
  },
  server: {
    proxy: {
      // The master refuses POSTs whose Origin is another host: present the master's own.
      "/api": { target: master, changeOrigin: true, headers: { Origin: master } },
    },
  },
});
