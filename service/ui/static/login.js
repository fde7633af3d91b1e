// A one-time login link is /login#code=mpl_...: the code is in the fragment, which the browser
// never sends to the server (so no access log holds it). Post it like a token, once, and take
// it out of the address bar and the history first.
(function () {
  "use strict";
  var match = /(?:^#|&)code=([^&]+)/.exec(window.location.hash);
  if (!match) { return; }
  history.replaceState(null, "", window.location.pathname + window.location.search);
  if (document.querySelector("[role=alert]")) { return; }  // the code was refused: do not loop
  document.getElementById("login-token").value = decodeURIComponent(match[1]);
  document.getElementById("login-form").submit();
})();
