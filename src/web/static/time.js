// Times on these pages arrive as UTC text in <time datetime="…" title="… UTC">. This rewrites the text to
// the reader's own time zone and how far away the moment is ("2 Dec 2026, 10:00 (in 2 days)"); the title
// keeps the exact UTC instant. Without the script the UTC text stands, so nothing depends on it.
/* global document */
'use strict';
(function () {
  var relative = new Intl.RelativeTimeFormat(undefined, { numeric: 'always' });
  var now = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
  var local = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
  var UNITS = [
    ['year', 365 * 86400],
    ['month', 30 * 86400],
    ['week', 7 * 86400],
    ['day', 86400],
    ['hour', 3600],
    ['minute', 60],
  ];

  /** "in 2 days", "5 minutes ago", "now": the largest unit the distance holds once. */
  function distance(seconds) {
    if (Math.abs(seconds) < 60) return now.format(0, 'second');
    for (var i = 0; i < UNITS.length; i++) {
      var unit = UNITS[i];
      if (Math.abs(seconds) >= unit[1]) return relative.format(Math.round(seconds / unit[1]), unit[0]);
    }
    return now.format(0, 'second');
  }

  function rewrite() {
    var times = document.querySelectorAll('time[datetime]');
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var at = Date.parse(el.getAttribute('datetime'));
      if (Number.isNaN(at)) continue;
      // Two runs, the moment and its distance: a narrow column (the audit log's) breaks between them,
      // never inside either. Made as text nodes, never markup.
      var moment = document.createElement('span');
      moment.className = 'moment';
      moment.textContent = local.format(at);
      var away = document.createElement('span');
      away.className = 'away';
      away.textContent = '(' + distance((at - Date.now()) / 1000) + ')';
      el.replaceChildren(moment, document.createTextNode(' '), away);
      el.setAttribute('data-local', '');
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', rewrite);
  else rewrite();
})();
