/**
 * @module Which methods a path has routes for, so that a request with another method is told
 * `405 Method Not Allowed` and what to use (`Allow`, RFC 9110 §15.5.5) instead of a 404 that
 * suggests the path is wrong.
 */

/** A route as Hono lists it in `app.routes`. */
export interface ListedRoute {
  readonly method: string;
  readonly path: string;
}

/**
 * Builds the lookup from an app's routes, once they are all registered. Middleware (`ALL`
 * routes) says nothing about methods and is left out; a `GET` route also answers `HEAD`.
 *
 * @returns for a request path, the methods its routes accept (sorted, empty when none matches)
 * @example
 * ```ts
 * const allowed = allowedMethods([{ method: "GET", path: "/v1/datasets/:name" }, { method: "PUT", path: "/v1/datasets/:name" }]);
 * allowed("/v1/datasets/web"); // ["GET", "HEAD", "PUT"]
 * ```
 */
export function allowedMethods(routes: readonly ListedRoute[]): (path: string) => string[] {
  const patterns = routes.filter((r) => r.method !== "ALL").map((r) => ({ method: r.method, pattern: routePattern(r.path) }));
  return (path) => {
    const methods = new Set<string>();
    for (const { method, pattern } of patterns) {
      if (!pattern.test(path)) continue;
      methods.add(method);
      if (method === "GET") methods.add("HEAD");
    }
    return [...methods].sort();
  };
}

/** A Hono path (`/a/:name`, `/a/:key{.+}`, `/a/*`) as an anchored regular expression. */
function routePattern(path: string): RegExp {
  let source = "";
  for (const part of path.split("/").slice(1)) {
    const param = /^:[A-Za-z0-9_]+(?:\{(.+)\})?$/.exec(part);
    source += "/" + (param ? `(?:${param[1] ?? "[^/]+"})` : part === "*" ? ".*" : part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  }
  return new RegExp(`^${source || "/"}$`);
}
