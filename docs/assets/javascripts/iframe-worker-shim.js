/* A Web Worker stand-in for the documentation opened from the file system (file://), where
   Chromium refuses to start a worker from a file URL. The worker's script runs in a hidden
   iframe of the page's own origin; messages cross both ways as events. The site's search (Material
   for MkDocs, English only) is the one user: it posts the search index and queries and reads the
   results. Material's offline plugin takes any polyfill whose name holds "iframe-worker" in place
   of the one it would fetch from a CDN, so the site loads nothing from outside itself.
   Written for headscope's documentation. */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof window.Worker === "undefined") return;

  function FileWorker(url) {
    var self = this;
    this.onmessage = null;
    this.onerror = null;
    this._listeners = {};
    this._pending = [];
    this._loaded = false;
    this._frame = document.createElement("iframe");
    this._frame.style.display = "none";
    (document.body || document.documentElement).appendChild(this._frame);
    var inner = this._frame.contentWindow;
    this._inner = inner;
    inner.postMessage = function (data) {  // the worker's own postMessage: to this object's listeners
      setTimeout(function () { self._emit("message", {data: data}); }, 0);
    };
    inner.importScripts = function () {
      throw new Error("importScripts is not available to a worker of a page opened from files");
    };
    var script = inner.document.createElement("script");
    script.src = String(url);
    script.onload = function () {
      self._loaded = true;
      self._pending.splice(0).forEach(function (data) { self.postMessage(data); });
    };
    script.onerror = function () { self._emit("error", {message: "could not load the worker " + url}); };
    (inner.document.head || inner.document.documentElement).appendChild(script);
  }

  FileWorker.prototype.postMessage = function (data) {
    if (!this._loaded) {
      this._pending.push(data);
      return;
    }
    var inner = this._inner;
    setTimeout(function () { inner.dispatchEvent(new inner.MessageEvent("message", {data: data})); }, 0);
  };
  FileWorker.prototype.addEventListener = function (type, listener) {
    (this._listeners[type] = this._listeners[type] || []).push(listener);
  };
  FileWorker.prototype.removeEventListener = function (type, listener) {
    var listeners = this._listeners[type] || [], at = listeners.indexOf(listener);
    if (at >= 0) listeners.splice(at, 1);
  };
  FileWorker.prototype._emit = function (type, event) {
    var handler = this["on" + type];
    if (typeof handler === "function") handler.call(this, event);
    (this._listeners[type] || []).slice().forEach(function (listener) { listener.call(this, event); }, this);
  };
  FileWorker.prototype.terminate = function () {
    this._frame.remove();
  };

  window.Worker = FileWorker;
})();
